"""Scenario `recovery`: what PS-shard failures cost with full recovery, partial recovery and
CPR's partial checkpoints (MFU, SSU), against a run without failures, at the CPR paper's
operating point (bench/operating_point.py: failures rare enough that full recovery costs about
``TARGET_FULL_OVERHEAD`` of the run).

N = 2 workers, S = 4 PS shards, mode async, the default DLRM and optimizers, one pass over the
same synthetic data in every arm. Dead shards are taken over by a warm standby
(``recovery.standby_shards``, default 1) in every failing arm but ``partial_no_standby``.

1. Calibration (``pilot``, on a small data set of its own): a full-recovery run with one kill
   measures the save cost O (what a checkpoint round blocks training, mean of its rounds), the
   downtime D of a full recovery (kill to the first pull served after the rollback), the work
   it did again beyond the time since its checkpoint R (``redo_beyond_interval``: chunks
   leased at the checkpoint start again), and the training rate.
2. The run length T at which full recovery's expected overhead is the target with
   ``FAILURES`` x ``--scale`` failures (MTBF T / K) is derived from O and D; the data set is
   made that long at the pilot's rate.
3. ``no_failure`` runs (no checkpoints, no failures); its training time T1 sets the schedule:
   exactly K kills, exponential inter-arrival times with mean M = T1 / K (the derived MTBF),
   each on a random shard, the first seed from 0 whose kills fall between ``FIRST_KILL_S`` and
   ``KILL_WINDOW`` x T1 and ``MIN_GAP_S`` apart. The kills are real (``os._exit``) and
   INJECTED (emulated), at the same times in every failing arm, whose ``recovery.mtbf_s`` is M:
   each chooses its checkpoint interval from it and its first round's measured cost (full:
   Young's; partial, MFU, SSU: the longest whose expected PLS stays under ``PLS_TARGET``) and
   chooses again at each round and failure from the costs and failures seen.

Arms: ``no_failure``; ``full`` (every shard, the workers and the data position roll back to
the last job checkpoint); ``partial`` (the failed shard alone reloads its own last checkpoint);
``cpr_mfu`` and ``cpr_ssu`` (partial recovery whose checkpoints save the most used rows, or the
rows a 2% sample of the training samples touched, with a full save every
``recovery.full_every``); ``partial_no_standby`` (Ray restarts the dead shard's process; round
1 only, for its downtime). ``ROUNDS`` rounds of the others, in that order: overheads and PLS
are the median of the rounds, AUC the mean.

Ratios, per failing arm X: ``X_overhead`` = (training time blocked by checkpoints + time
without training after each failure, from the kill to the first pull served again (full: after
the rollback) + training time lost (full: the work since the checkpoint rolled back to, done
again)) / T, all measured in the run (summary ``recovery.overhead``); ``X_pls``;
``X_minus_full_auc``; ``standby_downtime_p50_s`` and ``_max_s`` over every failure of the
partial arms with a standby in every round, ``no_standby_downtime_p50_s`` and ``_max_s`` of
``partial_no_standby``, ``full_downtime_p50_s``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from recsync.bench import operating_point as op
from recsync.bench import overhead as ov
from recsync.config import RunConfig, load_config
from recsync.metrics.core import read_jsonl
from recsync.metrics.plot import plot_runs

PILOT_ROWS, EVAL_ROWS = 600_000, 100_000
MAX_TABLE_ROWS = 200_000
WORKERS, SHARDS, BATCH = 2, 4, 2048
CHUNK_BATCHES = 8
TARGET_FULL_OVERHEAD = 0.08
FAILURES = 3  # per failing run, at --scale 1
PILOT_KILL_S, PILOT_EVERY_S = 10.0, 2.0
FIRST_KILL_S = 12.0  # seconds after training starts
KILL_WINDOW = 0.85
MIN_GAP_S = 10.0  # a full recovery restarts the workers: seconds
ROUNDS = 3
PLS_TARGET = 0.01
LENGTH_TOLERANCE = 0.1  # no_failure's training time may be this far from the derived length
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
    "partial_no_standby": ['recovery.kind="partial"', "recovery.standby_shards=0"],
}
ONCE = ("partial_no_standby",)
STANDBY_PARTIAL = ("partial", "cpr_mfu", "cpr_ssu")


def arm_config(data: Path, args: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *args])


def calibrate(out: Path) -> dict:
    """The pilot: a full recovery's downtime, the save cost and the training rate."""
    data = ov.make_data(out / "pilot-data", PILOT_ROWS, MAX_TABLE_ROWS, 20_000)
    cfg = arm_config(data, ['recovery.kind="full"', f"recovery.checkpoint_every_s={PILOT_EVERY_S}",
                            f'faults.kills=[{{target="ps", index=1, at_s={PILOT_KILL_S}}}]'])
    print("pilot: full recovery, one kill ...", flush=True)
    pilot = ov.run_arm(cfg, out / "arms" / "pilot", "pilot")
    rec = pilot["recovery"]
    if len(rec["recoveries"]) != 1:
        raise RuntimeError(f"the pilot recovered from {len(rec['recoveries'])} failures, not 1")
    rounds = rec["checkpoints"] - 1  # the round before training blocks nothing
    metrics = read_jsonl(out / "arms" / "pilot" / "metrics.jsonl")
    return {"save_s": rec["checkpoint_blocked_s"] / max(rounds, 1),
            "downtime_s": rec["recoveries"][0]["downtime_s"],
            "redo_s": redo_beyond_interval(metrics, rec["recoveries"][0]),
            "samples_per_s": rate_before(metrics, PILOT_KILL_S, ov.WARMUP_STEPS * WORKERS * BATCH),
            "rounds": rounds, "train_s": pilot["train_s"]}


def redo_beyond_interval(metrics: list[dict], recovery: dict) -> float:
    """Seconds of training a full recovery did again beyond the time from its checkpoint to
    the kill (which the model prices as half an interval on average): the work of chunks
    that were leased when the checkpoint was taken, trained again from their start."""
    taken = [e["time_s"] for r in metrics for e in r.get("events", [])
             if f"job checkpoint {recovery['job_sequence']}," in e["event"]]
    if not taken:
        raise RuntimeError(f"the pilot's metrics name no job checkpoint "
                           f"{recovery['job_sequence']}, which its recovery rolled back to")
    return max(0.0, recovery["lost_work_s"] - (recovery["killed_s"] - taken[0]))


def rate_before(metrics: list[dict], kill_s: float, warmup_samples: int) -> float:
    """Samples per second from the warm-up to the last metrics record before the kill (the
    rollback takes samples back after it)."""
    before = [r for r in metrics if r["samples"] >= warmup_samples and r["time_s"] < kill_s]
    if len(before) < 2 or before[-1]["time_s"] <= before[0]["time_s"]:
        raise RuntimeError(f"the pilot trained too little before its kill at {kill_s:g} s to "
                           f"measure its rate")
    a, b = before[0], before[-1]
    return (b["samples"] - a["samples"]) / (b["time_s"] - a["time_s"])


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    failures = max(FAILURES, round(FAILURES * scale))
    cal = calibrate(out)
    run_s = op.run_length_for(TARGET_FULL_OVERHEAD, failures, cal["save_s"], cal["downtime_s"],
                              cal["redo_s"])
    rows = round(run_s * cal["samples_per_s"])
    print(f"operating point: save {cal['save_s'] * 1e3:.1f} ms, full recovery down "
          f"{cal['downtime_s']:.2f} s and {cal['redo_s']:.2f} s done again beyond the interval "
          f"per failure: {failures} failures cost full recovery "
          f"{TARGET_FULL_OVERHEAD:.0%} over {run_s:.0f} s (MTBF {run_s / failures:.0f} s), "
          f"{rows:,} rows at {cal['samples_per_s']:,.0f} samples/s", flush=True)
    for attempt in range(2):  # the pilot's rate includes its checkpoints: T1 says how long
        data = ov.make_data(out / "data", rows, MAX_TABLE_ROWS, EVAL_ROWS)
        base = arm_config(data, [])
        print(f"round 1/{ROUNDS}: no_failure ...", flush=True)
        first = ov.run_arm(base, out / "arms" / "no_failure" / "round1", "no_failure")
        if attempt or abs(first["train_s"] / run_s - 1) <= LENGTH_TOLERANCE:
            break
        rows = round(rows * run_s / first["train_s"])
        print(f"no_failure trained {first['train_s']:.0f} s, not {run_s:.0f} s: {rows:,} rows "
              f"instead", flush=True)
    seed, mean, kills = op.failure_schedule(first["train_s"], first["first_step_done_s"] or 0.0,
                                            failures, SHARDS, FIRST_KILL_S, KILL_WINDOW,
                                            MIN_GAP_S)
    print(f"failure schedule (seed {seed}, MTBF {mean:.1f} s, EMULATED): "
          + ", ".join(f"shard {k['index']} at {k['at_s']} s" for k in kills), flush=True)
    faults = [f"faults.kills={_toml_list(kills)}", f"recovery.mtbf_s={mean:.3f}",
              f"recovery.pls_target={PLS_TARGET}"]
    cfgs = {"no_failure": base,
            **{name: arm_config(data, [*args, *faults]) for name, args in ARMS.items()}}
    results = {name: [] for name in cfgs}
    results["no_failure"].append(first)
    for r in range(ROUNDS):
        for name, cfg in cfgs.items():
            if (r == 0 and name == "no_failure") or (r > 0 and name in ONCE):
                continue
            print(f"round {r + 1}/{ROUNDS}: {name} ...", flush=True)
            results[name].append(ov.run_arm(cfg, out / "arms" / name / f"round{r + 1}", name))
    t0 = statistics.median(x["train_s"] for x in results["no_failure"])
    arms = {name: _arm(name, rounds, t0) for name, rounds in results.items()}
    plot_runs([out / "arms" / n / "round1" for n in arms], out / "quality.png",
              labels=list(arms))
    ratios = _ratios(arms, kills)
    wall_s = time.perf_counter() - started
    expected = op.full_overhead_at(t0, failures, cal["save_s"], cal["downtime_s"],
                                   cal["redo_s"])
    return {
        "scenario": "recovery",
        "description": (
            f"{WORKERS} workers x batch {BATCH}, {SHARDS} PS shards, mode async, one pass over "
            f"{arms['no_failure']['samples']:,} synthetic rows (tables up to "
            f"{MAX_TABLE_ROWS:,} rows) in every arm; default DLRM and optimizers, 1 intra-op "
            f"thread, chunks of {CHUNK_BATCHES} batches. Operating point (CPR paper: full "
            f"recovery about {TARGET_FULL_OVERHEAD:.0%}): the pilot (full recovery, "
            f"{PILOT_ROWS:,} rows, checkpoints every {PILOT_EVERY_S:g} s, shard 1 killed at "
            f"{PILOT_KILL_S:g} s) measured a save cost of {cal['save_s'] * 1e3:.1f} ms (mean "
            f"of {cal['rounds']} rounds), {cal['downtime_s']:.2f} s down per full "
            f"recovery and {cal['redo_s']:.2f} s of training done again beyond the time since "
            f"its checkpoint; with {failures} failures full recovery is expected to cost "
            f"{TARGET_FULL_OVERHEAD:.0%} over {run_s:.0f} s, hence the data set's length and "
            f"the derived MTBF {mean:.1f} s = T1 / {failures} (T1 = round 1's no_failure "
            f"training time {first['train_s']:.1f} s; expected full overhead at the median "
            f"T {expected:.3f}). FAILURES INJECTED (EMULATED): the shard processes are killed "
            f"(os._exit) at the same times in every failing arm: "
            + ", ".join(f"shard {k['index']} at {k['at_s']} s" for k in kills)
            + f" (seed {seed}: the first with exactly {failures} kills after "
            f"{FIRST_KILL_S:g} s, in the first {KILL_WINDOW:.0%} of T1, {MIN_GAP_S:g} s "
            f"apart). Each failing arm has recovery.mtbf_s = {mean:.1f} s, chooses its "
            f"checkpoint interval from it and its first round's measured cost (PLS target "
            f"{PLS_TARGET}) and again at each round and failure from what it has seen; a "
            f"warm standby shard takes over a dead one in every failing arm but "
            f"partial_no_standby (Ray restarts the process). "
            f"Overhead = (training blocked by checkpoints + time without training after each "
            f"failure, kill to the first pull served + training done again) / T, each measured "
            f"in the run, T = the median training time of no_failure; {ROUNDS} rounds "
            f"(partial_no_standby: 1): overhead and PLS the median, AUC the mean of the "
            f"rounds. Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "calibration": {**cal, "failures": failures, "target_full_overhead":
                        TARGET_FULL_OVERHEAD, "run_length_s": run_s, "rows": rows,
                        "expected_full_overhead_at_t": expected},
        "failure_schedule": {"seed": seed, "mean_s": mean, "kills": kills, "emulated": True},
        "wall_s": wall_s,
        "tables": {
            "Downtime per failure (kill to the first pull served), seconds": _downtime_rows(arms),
            "Where the overhead comes from (seconds)": [
                row for n, a in arms.items() if n != "no_failure" for row in _arm_rows(n, a)],
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def _arm(name: str, rounds: list[dict], t0: float) -> dict:
    a = {**ov.arm_entry_with_mean_auc(rounds), "recovery": rounds[-1]["recovery"],
         "recovery_rounds": [x["recovery"] for x in rounds]}
    if name != "no_failure":
        fracs = [x["recovery"]["overhead"]["total_s"] / t0 for x in rounds]
        a["overhead_frac"] = statistics.median(fracs)
        a["overhead_rounds"] = fracs
        a["extra_train_s"] = statistics.median(x["train_s"] - t0 for x in rounds)
        a["pls"] = statistics.median(x["recovery"]["pls"] for x in rounds)
        a["downtimes_s"] = [d["downtime_s"] for x in rounds for d in x["recovery"]["recoveries"]]
    return a


def _ratios(arms: dict, kills: list[dict]) -> dict:
    full_auc = arms["full"]["eval"]["auc"]
    ratios = {f"{name}_overhead": arms[name]["overhead_frac"] for name in ARMS}
    ratios.update({f"{name}_pls": arms[name]["pls"] for name in ARMS})
    for name in ("partial", "cpr_mfu", "cpr_ssu", "partial_no_standby"):
        ratios[f"{name}_minus_full_auc"] = arms[name]["eval"]["auc"] - full_auc
    ratios["full_minus_no_failure_auc"] = full_auc - arms["no_failure"]["eval"]["auc"]
    standby = [d for n in STANDBY_PARTIAL for d in arms[n]["downtimes_s"]]
    cold = arms["partial_no_standby"]["downtimes_s"]
    for key, values in (("standby_downtime", standby), ("no_standby_downtime", cold),
                        ("full_downtime", arms["full"]["downtimes_s"])):
        if values:
            ratios[f"{key}_p50_s"] = statistics.median(values)
            ratios[f"{key}_max_s"] = max(values)
    ratios["failures_per_run"] = len(kills)
    return ratios


def _toml_list(kills: list[dict]) -> str:
    return "[" + ", ".join(f'{{target="ps", index={k["index"]}, at_s={k["at_s"]}}}'
                           for k in kills) + "]"


def _downtime_rows(arms: dict) -> list[list]:
    rows = []
    for n, a in arms.items():
        d = a.get("downtimes_s")
        if d:
            rows.append([f"{n}: downtime p50 (s)", statistics.median(d),
                         f"max {max(d):.3f} s over {len(d)} failures: "
                         + ", ".join(f"{x:.3f}" for x in d)])
        parts = [p for rec in a.get("recovery_rounds", []) for p in take_over_split(rec)]
        if parts:
            rows.append([f"{n}: kill to a client asking for a standby (s), median",
                         statistics.median(p[0] for p in parts),
                         "then the take-over (core built, checkpoint loaded), median "
                         f"{statistics.median(p[1] for p in parts):.3f} s (max "
                         f"{max(p[1] for p in parts):.3f}), then to the first pull served, "
                         f"median {statistics.median(p[2] for p in parts):.3f} s; per failure: "
                         + "; ".join(f"{x:.3f} + {y:.3f} + {z:.3f}" for x, y, z in parts)])
    return rows


def take_over_split(rec: dict) -> list[tuple[float, float, float]]:
    """Each standby failure's downtime in three: from the kill to the directory being asked
    (a client saw the death), the take-over, and from then to the first pull served."""
    out, used = [], set()
    for r in rec["recoveries"]:
        if not r.get("standby") or r.get("downtime_to") != "first pull served":
            continue
        match = next((i for i, t in enumerate(rec.get("take_overs") or []) if i not in used
                      and t["shard"] == r["shard"] and t["asked_s"] >= r["killed_s"] - 1.0),
                     None)
        if match is None:
            continue
        used.add(match)
        t = rec["take_overs"][match]
        out.append((t["asked_s"] - r["killed_s"], t["ready_s"] - t["asked_s"],
                    r["killed_s"] + r["downtime_s"] - t["ready_s"]))
    return out


def _arm_rows(name: str, a: dict) -> list[list]:
    rows = [[f"{name}: overhead / T", a["overhead_frac"],
             "rounds: " + ", ".join(f"{x:.4f}" for x in a["overhead_rounds"])],
            [f"{name}: training time - T (s)", a["extra_train_s"],
             "cross-check, median of rounds, includes the machine's noise"],
            [f"{name}: eval AUC", a["eval"]["auc"],
             "rounds: " + ", ".join(f"{x:.4f}" for x in a["auc_rounds"])]]
    for r, rec in enumerate(a["recovery_rounds"], 1):
        o, decision = rec["overhead"], rec["interval_decision"] or {}
        rechosen = decision.get("rechosen") or []
        rows += [
            [f"{name} round {r}: overhead (s)", o["total_s"],
             f"blocked by checkpoints {o['checkpoint_blocked_s']:.2f}, without training after "
             f"failures {o['downtime_s']:.2f}, training done again {o['lost_work_s']:.2f}"],
            [f"{name} round {r}: checkpoints", rec["checkpoints"],
             f"shard checkpoints partial: {rec['partial_checkpoints']}; interval "
             f"{decision.get('used_interval_s', 0):.2f} s ({decision.get('used_kind')}), from "
             f"save cost {(decision.get('inputs') or {}).get('save_cost_s', 0) * 1e3:.1f} ms"
             + ("; after failures: " + ", ".join(f"{x['interval_s']:.2f} s (MTBF "
                                                   f"{x['mtbf_s']:.0f} s)" for x in rechosen)
                if rechosen else "")],
            [f"{name} round {r}: recoveries", len(rec["recoveries"]),
             "; ".join(f"shard {x['shard']} down {x['downtime_s']:.3f} s (to "
                       f"{x.get('downtime_to', 'ready')}), lost "
                       f"{x.get('lost_samples', 0):,} / redone {x.get('samples_redone', 0):,} "
                       f"samples" for x in rec["recoveries"])],
            [f"{name} round {r}: PLS", rec["pls"], ""]]
    return rows
