"""Scenario `shadow`: ShadowSync's background synchronization against no synchronization and
against the same algorithms run in the foreground every k iterations.

T = 2 trainers, S = 2 PS shards, one pass over the same synthetic data, the default DLRM
(MLPs [512, 256, 64] and [512, 256]), batch 4096 per trainer, chunks of 4 batches, the
default optimizers and learning rates, one Hogwild thread per trainer and one intra-op thread,
in every arm:

- ``none``: mode shadow with ``shadow.algorithm = "none"``: each trainer trains its own dense
  replica, never synchronized (the throughput ceiling);
- ``s_ma``, ``s_easgd``, ``s_bmuf``: mode shadow, the shadow thread syncing as fast as it can
  but at most once per ``shadow.min_interval_s``, set to the median step time of a trainer in
  round 1's ``none`` arm: about one background sync per training iteration;
- ``fr_ma``, ``fr_easgd``, ``fr_bmuf``: mode foreground, syncing inside the training loop every
  k iterations. k is chosen so that the sync frequency is comparable: it is the mean realised
  sync gap (training iterations between two syncs) of the background arm of the same algorithm
  in round 1, rounded, and at least 1. (The foreground cannot sync more often than once per
  iteration; that is why the background interval is one step time: at the default 0.1 s the
  shadow thread synced 2.5 times per iteration here, and no k could match it.)
- ``s_ma_h1``, ``s_ma_h2``: one trainer with 1 and 2 Hogwild threads (the Hogwild speed-up; MA
  among one trainer runs its rounds but moves nothing), with the same interval.

The arms alternate over ``ROUNDS`` rounds. samples/s counts the steps after a warm-up (from the
metrics logs, as in scenario `overhead`), the median of the rounds; AUC is the whole eval split's
at the end of a run, the mean of the rounds (the async embedding updates make single runs
scatter by a few thousandths). Ratios: ``s_X_vs_none_speed``, ``fr_X_vs_none_speed``,
``s_X_minus_fr_X_auc`` for X in ma, easgd, bmuf, and ``hogwild_2_vs_1_speed``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from recsync.bench import overhead as ov
from recsync.config import RunConfig, load_config
from recsync.data.synthetic import SynthSpec
from recsync.plot import plot_runs

ROUNDS = 3
ROWS = 800_000  # training rows at --scale 1
EVAL_ROWS = 100_000
TRAINERS, SHARDS, BATCH = 2, 2, 4096
CHUNK_BATCHES = 4  # small chunks: at the end, one trainer (or thread) runs alone for little time
ALGORITHMS = ("ma", "easgd", "bmuf")
COMMON = [
    f"cluster.ps_shards={SHARDS}", f"train.batch_size={BATCH}", "train.threads=1",
    f"data.chunk_rows={CHUNK_BATCHES * BATCH}",
    "output.progress=false", "output.plot=false", "output.log_every_steps=1",
    "train.eval_every_samples=1000000000000",  # only the final evaluation: throughput arms
]


def arm_args(name: str, k: dict[str, int], interval_s: float | None) -> list[str]:
    """The config overrides of arm ``name`` (``k``: foreground k per algorithm;
    ``interval_s``: the background arms' least time between syncs)."""
    interval = [] if interval_s is None else [f"shadow.min_interval_s={interval_s}"]
    if name in ("s_ma_h1", "s_ma_h2"):
        return ['mode="shadow"', 'shadow.algorithm="ma"', "cluster.workers=1",
                f"shadow.hogwild_threads={name[-1]}", *interval]
    base = [f"cluster.workers={TRAINERS}", "shadow.hogwild_threads=1"]
    if name == "none":
        return [*base, 'mode="shadow"', 'shadow.algorithm="none"']
    kind, algorithm = name.split("_")
    if kind == "s":
        return [*base, 'mode="shadow"', f'shadow.algorithm="{algorithm}"', *interval]
    return [*base, 'mode="foreground"', f'shadow.algorithm="{algorithm}"',
            f"shadow.foreground_every={k[algorithm]}"]


def arm_config(data: Path, args: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *args])


def k_from_gap(gap_mean: float | None) -> int:
    """Foreground k matching a background arm's mean sync gap (at least 1)."""
    return max(1, round(gap_mean or 1.0))


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    data = ov.make_data(out / "data", max(200_000, round(ROWS * scale)),
                        SynthSpec().max_table_rows, EVAL_ROWS)
    background = ["none"] + [f"s_{a}" for a in ALGORITHMS]
    foreground = [f"fr_{a}" for a in ALGORITHMS]
    hogwild = ["s_ma_h1", "s_ma_h2"]
    runs: dict[str, list[dict]] = {n: [] for n in background + foreground + hogwild}
    k: dict[str, int] = {}
    interval_s = None
    cfgs: dict[str, RunConfig] = {}
    for r in range(ROUNDS):
        for name in background + foreground + hogwild:
            if name != "none" and interval_s is None:  # after round 1's none arm
                interval_s = round(runs["none"][0]["worker_step_s_median"], 2)
                print(f"shadow.min_interval_s = {interval_s} (a trainer's median step time in "
                      f"arm none)", flush=True)
            if name in foreground and not k:  # after round 1's background arms
                k = {a: k_from_gap(runs[f"s_{a}"][0]["shadow"]["sync_gap"]["mean"])
                     for a in ALGORITHMS}
                print(f"foreground k (mean sync gap of the background arms): {k}", flush=True)
            cfgs[name] = arm_config(data, arm_args(name, k, interval_s))
            print(f"round {r + 1}/{ROUNDS}: {name} ...", flush=True)
            runs[name].append(ov.run_arm(cfgs[name], out / "arms" / name / f"round{r + 1}",
                                         name))
            print(f"  eval AUC {runs[name][-1]['eval']['auc']:.4f}", flush=True)
    arms = {}
    for name, results in runs.items():
        arms[name] = {**ov.arm_entry_with_mean_auc(results),
                      "shadow_rounds": [x["shadow"] for x in results]}
    plot_runs([out / "arms" / n / "round1" for n in arms], out / "quality.png",
              labels=list(arms))

    def speed(name):
        return arms[name]["samples_per_s"]

    def auc(name):
        return arms[name]["eval"]["auc"]

    ratios = {}
    for a in ALGORITHMS:
        ratios[f"s_{a}_vs_none_speed"] = speed(f"s_{a}") / speed("none")
    for a in ALGORITHMS:
        ratios[f"fr_{a}_vs_none_speed"] = speed(f"fr_{a}") / speed("none")
    for a in ALGORITHMS:
        ratios[f"s_{a}_minus_fr_{a}_auc"] = auc(f"s_{a}") - auc(f"fr_{a}")
    ratios["hogwild_2_vs_1_speed"] = speed("s_ma_h2") / speed("s_ma_h1")
    for a in ALGORITHMS:
        ratios[f"s_{a}_minus_none_auc"] = auc(f"s_{a}") - auc("none")
    wall_s = time.perf_counter() - started
    return {
        "scenario": "shadow",
        "description": (
            f"{TRAINERS} trainers x batch {BATCH}, {SHARDS} PS shards, one pass over "
            f"{arms['none']['samples']:,} synthetic rows in every arm (the Hogwild pair: 1 "
            f"trainer); default DLRM and optimizers; 1 Hogwild thread per trainer except in "
            f"s_ma_h2; shadow.min_interval_s {interval_s:g} s (a trainer's median step time "
            f"in round 1 of arm none); foreground k = "
            + ", ".join(f"{a} {v}" for a, v in k.items())
            + f" (the mean sync gap of the background arm of the same algorithm in round 1, "
              f"rounded, at least 1). All processes share the machine's {os.cpu_count()} "
              f"cores: the shadow thread has no core of its own. {ROUNDS} alternating rounds; "
              f"samples/s after a warm-up of {ov.WARMUP_STEPS} steps per trainer, median of "
              f"rounds; AUC on the whole eval split ({EVAL_ROWS:,} rows), mean of rounds "
              f"(also in the table of arms). Chunks of {CHUNK_BATCHES} batches. "
              f"Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "foreground_k": k,
        "wall_s": wall_s,
        "tables": {
            "Speed, quality and synchronization per arm": [
                row for n, a in arms.items() for row in _arm_rows(n, a)],
            "Throughput as summary.json reports it (train_s from the first step)":
                ov.summary_rows(arms, {}),
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def _arm_rows(name: str, a: dict) -> list[list]:
    sh = a["shadow"]  # the last round's
    rows = [[f"{name}: samples/s", a["samples_per_s"],
             "rounds: " + ", ".join(f"{x:,.0f}" for x in a["rounds_samples_per_s"])],
            [f"{name}: eval AUC", a["eval"]["auc"],
             "rounds: " + ", ".join(f"{x:.4f}" for x in a["auc_rounds"])]]
    if sh["algorithm"] != "none":
        gaps = [s["sync_gap"] for s in a["shadow_rounds"]]
        rows += [[f"{name}: sync gap (iterations), mean", gaps[-1]["mean"],
                  "p99 / max per round: " + ", ".join(f"{g['p99']} / {g['max']}" for g in gaps)
                  + ("; background" if sh["background"] else
                     f"; foreground every {sh['foreground_every']}")],
                 [f"{name}: syncs/s per trainer", statistics.mean(sh["syncs_per_s"]),
                  f"last round; a sync took {sh['sync_s_mean'] * 1e3:.1f} ms on average "
                  f"(its collective waits for the other trainers)"]]
    return rows
