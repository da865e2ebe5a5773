"""Scenario `recovery`: what PS-shard failures cost with full recovery, partial recovery and
CPR's partial checkpoints (MFU, SSU), against a run without failures.

N = 2 workers, S = 4 PS shards, mode async, the default DLRM and optimizers, one pass over the
same synthetic data in every arm. First ``no_failure`` runs (no checkpoints, no failures); its
training time T sets the failure schedule: exponential inter-arrival times with mean T / 4
(``EXPECTED_FAILURES``), each on a random shard, drawn with the first seed from 0 whose schedule
has 3 to 5 kills between ``FIRST_KILL_S`` and ``KILL_WINDOW`` x T after the first step (so that
every arm lives through all of them) and at least ``MIN_GAP_S`` between two kills (Ray takes
seconds to restart a shard; a kill while it restarts would be a different experiment). The kills
are real (the shard's process exits: ``os._exit``) and INJECTED (emulated failures), at the same
times after the first step in every failing arm; the mean T / 4 is also each arm's
``recovery.mtbf_s``, from which the run chooses its checkpoint interval after measuring its
first checkpoint's cost (full: Young's interval; partial, MFU, SSU: the longest interval whose
expected PLS stays under ``PLS_TARGET``).

Arms: ``no_failure``; ``full`` (every shard, the workers and the data position roll back to
the last job checkpoint); ``partial`` (the failed shard alone reloads its own last checkpoint);
``cpr_mfu`` and ``cpr_ssu`` (partial recovery whose checkpoints save the most used rows, or the
rows a 2% sample of the training samples touched, with a full save every
``recovery.full_every``).

``ROUNDS`` rounds, each arm once per round in the order above (the schedule from round 1's
no_failure): overheads and PLS are the median of the rounds, AUC the mean.

Ratios, per failing arm X: ``X_overhead`` = (training time blocked by checkpoints + time
without training after each failure, from the kill until the shard serves again (full: until
fresh workers train again) + training time lost (full: the work since the checkpoint rolled
back to, done again)) / T, all measured in the run (summary ``recovery.overhead``);
``X_pls``; ``X_minus_full_auc``. Also reported: the arm's extra training time over T (a
cross-check of the overhead, with the machine's noise in it) and the components.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

from recsync.bench import overhead as ov
from recsync.config import RunConfig, load_config
from recsync.plot import plot_runs

ROWS = 2_000_000  # training rows at --scale 1
EVAL_ROWS = 100_000
MAX_TABLE_ROWS = 200_000
WORKERS, SHARDS, BATCH = 2, 4, 2048
CHUNK_BATCHES = 8
EXPECTED_FAILURES = 4
FIRST_KILL_S = 12.0  # seconds after the run starts (workers take ~6 s to start here)
KILL_WINDOW = 0.8
MIN_GAP_S = 10.0
ROUNDS = 3
PLS_TARGET = 0.01
COMMON = [
    'mode="async"', f"cluster.workers={WORKERS}", f"cluster.ps_shards={SHARDS}",
    f"train.batch_size={BATCH}", "train.threads=1", f"data.chunk_rows={CHUNK_BATCHES * BATCH}",
    "output.progress=false", "output.plot=false", "output.log_every_steps=1",
    "train.eval_every_samples=1000000000000",  # only the final evaluation: throughput arms
]
ARMS = {
    "full": ['recovery.kind="full"'],
    "partial": ['recovery.kind="partial"'],
    "cpr_mfu": ['recovery.kind="partial"', 'recovery.rows="mfu"'],
    "cpr_ssu": ['recovery.kind="partial"', 'recovery.rows="ssu"'],
}


def arm_config(data: Path, args: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *args])


def failure_schedule(train_s: float, start_s: float) -> tuple[int, float, list[dict]]:
    """(seed, mean, kills): the first seed whose exponential schedule (mean train_s /
    EXPECTED_FAILURES) has 3 to 5 kills in [FIRST_KILL_S, start_s + KILL_WINDOW x train_s],
    MIN_GAP_S apart."""
    mean = train_s / EXPECTED_FAILURES
    end = start_s + KILL_WINDOW * train_s
    for seed in range(1000):
        rng = random.Random(seed)
        at, kills = rng.expovariate(1 / mean), []
        while at < end:
            kills.append({"target": "ps", "index": rng.randrange(SHARDS), "at_s": round(at, 1)})
            at += rng.expovariate(1 / mean)
        times = [k["at_s"] for k in kills]
        if (3 <= len(kills) <= 5 and times[0] >= FIRST_KILL_S
                and all(b - a >= MIN_GAP_S for a, b in zip(times, times[1:]))):
            return seed, mean, kills
    raise RuntimeError("no seed below 1000 gives 3 to 5 kills with the required gaps")


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    data = ov.make_data(out / "data", max(100_000, round(ROWS * scale)), MAX_TABLE_ROWS,
                        EVAL_ROWS)
    base = arm_config(data, [])
    print(f"round 1/{ROUNDS}: no_failure ...", flush=True)
    first = ov.run_arm(base, out / "arms" / "no_failure" / "round1", "no_failure")
    start_s = first["first_step_done_s"] or 0.0
    seed, mean, kills = failure_schedule(first["train_s"], start_s)
    print(f"failure schedule (seed {seed}, mean {mean:.1f} s, EMULATED): "
          + ", ".join(f"shard {k['index']} at {k['at_s']} s" for k in kills), flush=True)
    faults = [f"faults.kills={_toml_list(kills)}", f"recovery.mtbf_s={mean:.3f}",
              f"recovery.pls_target={PLS_TARGET}"]
    cfgs = {"no_failure": base,
            **{name: arm_config(data, [*args, *faults]) for name, args in ARMS.items()}}
    results = {name: [] for name in cfgs}
    results["no_failure"].append(first)
    for r in range(ROUNDS):
        for name, cfg in cfgs.items():
            if r == 0 and name == "no_failure":
                continue
            print(f"round {r + 1}/{ROUNDS}: {name} ...", flush=True)
            results[name].append(ov.run_arm(cfg, out / "arms" / name / f"round{r + 1}", name))
    t0 = statistics.median(x["train_s"] for x in results["no_failure"])
    arms = {}
    for name, rounds in results.items():
        a = {**ov.arm_entry_with_mean_auc(rounds), "recovery": rounds[-1]["recovery"],
             "recovery_rounds": [x["recovery"] for x in rounds]}
        if name != "no_failure":
            fracs = [x["recovery"]["overhead"]["total_s"] / t0 for x in rounds]
            a["overhead_frac"] = statistics.median(fracs)
            a["overhead_rounds"] = fracs
            a["extra_train_s"] = statistics.median(x["train_s"] - t0 for x in rounds)
            a["pls"] = statistics.median(x["recovery"]["pls"] for x in rounds)
        arms[name] = a
    plot_runs([out / "arms" / n / "round1" for n in arms], out / "quality.png",
              labels=list(arms))
    full_auc = arms["full"]["eval"]["auc"]
    ratios = {}
    for name in ARMS:
        ratios[f"{name}_overhead"] = arms[name]["overhead_frac"]
    for name in ARMS:
        ratios[f"{name}_pls"] = arms[name]["pls"]
    for name in ("partial", "cpr_mfu", "cpr_ssu"):
        ratios[f"{name}_minus_full_auc"] = arms[name]["eval"]["auc"] - full_auc
    ratios["full_minus_no_failure_auc"] = full_auc - arms["no_failure"]["eval"]["auc"]
    wall_s = time.perf_counter() - started
    return {
        "scenario": "recovery",
        "description": (
            f"{WORKERS} workers x batch {BATCH}, {SHARDS} PS shards, mode async, one pass over "
            f"{arms['no_failure']['samples']:,} synthetic rows (tables up to "
            f"{MAX_TABLE_ROWS:,} rows) in every arm; default DLRM and optimizers, 1 intra-op "
            f"thread, chunks of {CHUNK_BATCHES} batches. FAILURES INJECTED (EMULATED): the "
            f"shard processes are killed (os._exit) at the same times in every failing arm: "
            + ", ".join(f"shard {k['index']} at {k['at_s']} s" for k in kills)
            + f" (seed {seed} of exponential inter-arrival times with mean T1 / "
            f"{EXPECTED_FAILURES} = {mean:.1f} s, T1 = round 1's no_failure training time "
            f"{first['train_s']:.1f} s; the first seed with 3-5 kills after {FIRST_KILL_S:g} s, "
            f"in the first {KILL_WINDOW:.0%} of T1 and {MIN_GAP_S:g} s apart). Each failing arm "
            f"has recovery.mtbf_s = {mean:.1f} s and "
            f"chooses its checkpoint interval from it and its first checkpoint's measured cost "
            f"(PLS target {PLS_TARGET}). Overhead = (training blocked by checkpoints + time "
            f"without training after each failure + training done again) / T, each measured "
            f"in the run (tables below), over T = the median training time of no_failure; "
            f"{ROUNDS} rounds: overhead and PLS the median, AUC the mean of the rounds. "
            f"Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "failure_schedule": {"seed": seed, "mean_s": mean, "kills": kills, "emulated": True},
        "wall_s": wall_s,
        "tables": {
            "Where the overhead comes from (seconds)": [
                row for n, a in arms.items() if n != "no_failure" for row in _arm_rows(n, a)],
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def _toml_list(kills: list[dict]) -> str:
    return "[" + ", ".join(f'{{target="ps", index={k["index"]}, at_s={k["at_s"]}}}'
                           for k in kills) + "]"


def _arm_rows(name: str, a: dict) -> list[list]:
    rows = [[f"{name}: overhead / T", a["overhead_frac"],
             "rounds: " + ", ".join(f"{x:.4f}" for x in a["overhead_rounds"])],
            [f"{name}: training time - T (s)", a["extra_train_s"],
             "cross-check, median of rounds, includes the machine's noise"],
            [f"{name}: eval AUC", a["eval"]["auc"],
             "rounds: " + ", ".join(f"{x:.4f}" for x in a["auc_rounds"])]]
    for r, rec in enumerate(a["recovery_rounds"], 1):
        o, decision = rec["overhead"], rec["interval_decision"] or {}
        rows += [
            [f"{name} round {r}: overhead (s)", o["total_s"],
             f"blocked by checkpoints {o['checkpoint_blocked_s']:.2f}, without training after "
             f"failures {o['downtime_s']:.2f}, training done again {o['lost_work_s']:.2f}"],
            [f"{name} round {r}: checkpoints", rec["checkpoints"],
             f"shard checkpoints partial: {rec['partial_checkpoints']}; interval "
             f"{decision.get('used_interval_s', 0):.2f} s ({decision.get('used_kind')}), from "
             f"save cost {(decision.get('inputs') or {}).get('save_cost_s', 0) * 1e3:.1f} ms"],
            [f"{name} round {r}: recoveries", len(rec["recoveries"]),
             "; ".join(f"shard {x['shard']} down {x['downtime_s']:.1f} s, lost "
                       f"{x.get('lost_samples', 0):,} / redone {x.get('samples_redone', 0):,} "
                       f"samples" for x in rec["recoveries"])],
            [f"{name} round {r}: PLS", rec["pls"], ""]]
    return rows
