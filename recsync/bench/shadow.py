"""Scenario `shadow`: ShadowSync's background synchronization against no synchronization and
against the same algorithms run in the foreground every k iterations, and its throughput with
1, 2 and 4 trainers at a fixed number of PS shards, on an EMULATED cluster.

T = 4 trainers x ``CORES_PER_TRAINER`` cores (+ ``CORES_PER_SHADOW`` for the shadow thread in
the mode shadow arms), S = 2 PS shards x ``CORES_PER_SHARD`` cores (``[emulation]``: each
process paces itself as a machine of that size), one pass over the same
synthetic data (emulated.BENCH_SPEC), DLRM with small MLPs (``MLPS``), batch 4096 per
trainer, chunks of 4 batches, the default optimizers and learning rates, one Hogwild thread
per trainer, in every arm:

- ``none``: mode shadow with ``shadow.algorithm = "none"``: each trainer trains its own dense
  replica, never synchronized (the throughput ceiling);
- ``s_ma``, ``s_easgd``, ``s_bmuf``: mode shadow, the shadow thread syncing as fast as it can
  but at most once per ``shadow.min_interval_s``, set to the median step time of a trainer in
  seed 0's ``none`` arm: about one background sync per training iteration;
- ``fr_ma``, ``fr_easgd``, ``fr_bmuf``: mode foreground, syncing inside the training loop every
  k iterations, k the mean realised sync gap of seed 0's background arm of the same algorithm,
  rounded, at least 1 (the foreground cannot sync more often than once per iteration);
- ``s_ma_trainers_1``, ``s_ma_trainers_2``: s_ma with 1 and 2 trainers on the same 2 shards,
  seed 0 only, each trainer taking as many steps as a trainer of the 4-trainer arms (speed
  only): ShadowSync's claim that throughput grows linearly with the trainers.

(The Hogwild pair of earlier versions is gone: on the emulated cluster a trainer's threads share
its cores, so more threads cannot be faster by construction.)

Every arm but the two speed-only ones runs once per seed (``--seeds``, ``train.seed``; arms
interleaved). samples/s counts the steps after a warm-up (from the metrics logs, as in scenario
`overhead`), the median of the seeds; AUC is the whole eval split's at the end of a run, the mean
of the seeds, and arms are compared by paired differences per seed. Ratios:
``shadow_4_vs_1_speed`` and ``shadow_2_vs_1_speed`` (ideal 4 and 2), ``s_X_vs_none_speed``,
``fr_X_vs_none_speed`` (ideal 1), ``s_X_minus_fr_X_auc`` and ``s_X_minus_none_auc`` for X in ma,
easgd, bmuf.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench import overhead as ov
from recsync.bench import seeds as sd
from recsync.config import RunConfig, load_config
from recsync.metrics.plot import plot_runs

ROWS = 300_000  # training rows at --scale 1
EVAL_ROWS = 100_000
TRAINERS, SHARDS, BATCH = 4, 2, 4096
# Each shard served requests 12% of the time at 0.5 cores in the 2026-11-23 run (seed 0 of arm
# none: summary.json paced_wall_s over train_s); at 0.375 it is about a sixth busy and does not
# cap the 4-trainer arm's throughput, which leaves 4 x 0.0625 cores for the shadow threads: the
# ShadowSync paper's trainers have cores to spare for their background rounds, so in the mode
# shadow arms the rounds run on cores of their own (``emulation.cores_per_shadow``); the
# foreground arms have none (their rounds run in the training loop by design)
CORES_PER_TRAINER, CORES_PER_SHARD, CORES_PER_SHADOW = 0.125, 0.375, 0.0625
CHUNK_BATCHES = 4  # small chunks: at the end, one trainer runs alone for little time
# small MLPs (those of scenario `stragglers`): a trainer's step at 0.125 cores with the default
# [512, 256, 64] / [512, 256] would take over a second, too long for 5 seeds of 7 arms
MLPS = ["model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]"]
ALGORITHMS = ("ma", "easgd", "bmuf")
SCALING = {"s_ma_trainers_1": 1, "s_ma_trainers_2": 2}  # speed only, seed 0
COMMON = [
    f"cluster.ps_shards={SHARDS}", f"train.batch_size={BATCH}", "train.threads=1",
    f"data.chunk_rows={CHUNK_BATCHES * BATCH}", *MLPS, "shadow.hogwild_threads=1",
    "output.progress=false", "output.plot=false", "output.log_every_steps=1",
    "train.eval_every_samples=1000000000000",  # only the final evaluation: throughput arms
    # no dense warm-up (the default 100 updates would span all ~60 of sync's updates here, and
    # the data set and sizes were chosen without it): docs/sync_modes.md has its own figures
    "train.dense_warmup_steps=0",
    *em.emulation_args(CORES_PER_TRAINER, CORES_PER_SHARD),
]


def arm_args(name: str, k: dict[str, int], interval_s: float | None, steps: int) -> list[str]:
    """The config overrides of arm ``name`` (``k``: foreground k per algorithm;
    ``interval_s``: the background arms' least time between syncs; ``steps``: a trainer's
    steps in the 4-trainer arms, the limit of the speed-only arms)."""
    interval = [] if interval_s is None else [f"shadow.min_interval_s={interval_s}"]
    shadow = ['mode="shadow"', f"emulation.cores_per_shadow={CORES_PER_SHADOW}"]
    if name in SCALING:
        return [*shadow, 'shadow.algorithm="ma"', f"cluster.workers={SCALING[name]}",
                f"train.max_steps={steps}", *interval]
    base = [f"cluster.workers={TRAINERS}"]
    if name == "none":
        return [*base, *shadow, 'shadow.algorithm="none"']
    kind, algorithm = name.split("_")
    if kind == "s":
        return [*base, *shadow, f'shadow.algorithm="{algorithm}"', *interval]
    return [*base, 'mode="foreground"', f'shadow.algorithm="{algorithm}"',
            f"shadow.foreground_every={k[algorithm]}"]


def arm_config(data: Path, args: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *args])


def k_from_gap(gap_mean: float | None) -> int:
    """Foreground k matching a background arm's mean sync gap (at least 1)."""
    return max(1, round(gap_mean or 1.0))


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    rows = max(100_000, round(ROWS * scale))
    data = em.make_data(out / "data", rows, EVAL_ROWS)
    steps = rows // (TRAINERS * BATCH)
    background = ["none"] + [f"s_{a}" for a in ALGORITHMS]
    foreground = [f"fr_{a}" for a in ALGORITHMS]
    names = background + foreground + list(SCALING)
    k: dict[str, int] = {}
    interval: list[float] = []  # set after seed 0's none arm
    cfgs: dict[str, RunConfig] = {}
    runs: dict[str, list[dict]] = {}

    def config(name: str) -> RunConfig:  # called just before each run: seed 0 sets k, interval
        if name != "none" and not interval:
            interval.append(round(runs["none"][0]["worker_step_s_median"], 2))
            print(f"shadow.min_interval_s = {interval[0]} (a trainer's median step time in "
                  f"arm none)", flush=True)
        if name in foreground and not k:
            k.update({a: k_from_gap(runs[f"s_{a}"][0]["shadow"]["sync_gap"]["mean"])
                      for a in ALGORITHMS})
            print(f"foreground k (mean sync gap of the background arms): {k}", flush=True)
        cfgs[name] = arm_config(data, arm_args(name, k, interval[0] if interval else None,
                                               steps))
        return cfgs[name]

    sd.seeded_runs(names, config, out, seeds, once=tuple(SCALING), results=runs)
    arms = {name: {**sd.seeded_entry(results), "shadow_seeds": [x["shadow"] for x in results]}
            for name, results in runs.items()}
    plot_runs([out / "arms" / n / "seed0" for n in arms], out / "quality.png",
              labels=list(arms))

    def speed(name):
        return arms[name]["samples_per_s"]

    ideals = {"shadow_4_vs_1_speed": (speed("s_ma") / speed("s_ma_trainers_1"), 4.0),
              "shadow_2_vs_1_speed": (speed("s_ma_trainers_2") / speed("s_ma_trainers_1"), 2.0)}
    for kind in ("s", "fr"):
        ideals.update({f"{kind}_{a}_vs_none_speed": (speed(f"{kind}_{a}") / speed("none"), 1.0)
                       for a in ALGORITHMS})
    diffs = {f"s_{a}_minus_fr_{a}_auc": sd.auc_difference(arms, f"s_{a}", f"fr_{a}")
             for a in ALGORITHMS}
    diffs.update({f"s_{a}_minus_none_auc": sd.auc_difference(arms, f"s_{a}", "none")
                  for a in ALGORITHMS})
    ratios = {name: measured for name, (measured, _) in ideals.items()}
    ratios.update({name: d["mean"] for name, d in diffs.items()})
    worst = em.worst_worker_deviation(arms)
    if worst is not None:
        ratios["emulation_worst_worker_deviation"] = worst
    wall_s = time.perf_counter() - started
    return {
        "scenario": "shadow",
        "emulation_label": em.label(arms),
        "description": (
            f"{TRAINERS} trainers x batch {BATCH}, {SHARDS} PS shards, one "
            f"pass over {arms['none']['samples']:,} synthetic rows ({em.spec_text()}) in every "
            f"arm (s_ma_trainers_1 and _2: {steps} steps per trainer, speed only, seed 0); DLRM "
            f"({', '.join(MLPS)}), default optimizers; 1 Hogwild thread per trainer; "
            f"shadow.min_interval_s {interval[0] if interval else 'n/a'} s (a trainer's median "
            f"step time in seed 0 of arm none); foreground k = "
            + ", ".join(f"{a} {v}" for a, v in k.items())
            + f" (the mean sync gap of the background arm of the same algorithm in seed 0, "
              f"rounded, at least 1). In the mode shadow arms (none, s_*) each trainer's "
              f"shadow thread has EMULATED cores of its own ({CORES_PER_SHADOW:g}: "
              f"emulation.cores_per_shadow; its thread's CPU time is paced there and taken "
              f"off the trainer's, while what Ray's and gloo's helper threads do for a round "
              f"stays on the trainer's); the foreground arms run their rounds in the "
              f"training loop on the trainer's {CORES_PER_TRAINER:g} cores. "
              f"{seeds} seeds per arm, arms interleaved; "
              f"samples/s after a warm-up "
              f"of {ov.WARMUP_STEPS} steps per trainer, median of seeds; AUC on the whole eval "
              f"split ({EVAL_ROWS:,} rows), mean of seeds, differences paired by seed. Chunks "
              f"of {CHUNK_BATCHES} batches. Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "ideals": {k_: {"measured": m, "ideal": i, "of_ideal": m / i}
                   for k_, (m, i) in ideals.items()},
        "differences": diffs,
        "seeds": seeds,
        "foreground_k": k,
        "wall_s": wall_s,
        "tables": {
            "AUC differences, paired by seed (mean, 95% t-interval)": [
                sd.difference_row(n, d) for n, d in diffs.items()],
            "Quality per arm": sd.auc_rows({n: a for n, a in arms.items() if n not in SCALING}),
            "Speed and synchronization per arm": [
                row for n, a in arms.items() for row in _arm_rows(n, a)],
            "Throughput as summary.json reports it (train_s from the first step)":
                ov.summary_rows(arms, {}),
            "EMULATED cluster: wall time over CPU time of each process": em.emulation_rows(arms),
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def _arm_rows(name: str, a: dict) -> list[list]:
    sh = a["shadow"]  # the last seed's
    rows = [[f"{name}: samples/s", a["samples_per_s"],
             "seeds: " + ", ".join(f"{x:,.0f}" for x in a["rounds_samples_per_s"])]]
    if sh["algorithm"] != "none":
        gaps = [s["sync_gap"] for s in a["shadow_seeds"]]
        rows += [[f"{name}: sync gap (iterations), mean", gaps[-1]["mean"],
                  "p99 / max per seed: " + ", ".join(f"{g['p99']} / {g['max']}" for g in gaps)
                  + ("; background" if sh["background"] else
                     f"; foreground every {sh['foreground_every']}")],
                 [f"{name}: syncs/s per trainer", statistics.mean(sh["syncs_per_s"]),
                  f"last seed; a sync took {sh['sync_s_mean'] * 1e3:.1f} ms on average "
                  f"(its collective waits for the other trainers)"]]
    return rows
