"""Scenario `chaos`: every sync mode trains with recovery on while its workers and PS shards are
killed at random, and we count what came through: kills survived, chunks completed other than
exactly once, samples lost (PLS) and done again, and processes left behind.

One arm per mode of the registry (``recsync.modes.MODES``), each ``recsync train`` as a user
runs it (``run.run``): N = 2 workers x batch 4096, S = 2 PS shards, one pass over the same
synthetic data, the default DLRM, optimizers and mode settings, 1 intra-op thread per process,
chunks of 4 batches, a checkpoint round every ``CHECKPOINT_EVERY_S`` s. Recovery: partial
(a killed shard reloads its own last checkpoint, the rest goes on) where the mode allows it,
else full (modes whose shards move in lock-step, sync and hybrid: everything rolls back to the
last job checkpoint). A killed worker is handled as its mode says (``Mode.worker_death``:
replaced, its group rebuilt, or restarted from a live replica).

The kills are INJECTED (emulated failures): the process really exits (``os._exit``). They are
due at the same times since the start of training in every arm, and made then, or later when
the driver is busy (a recovery) or the process is still down from an earlier kill
(``distributed/faults.py``); each is logged when made. The schedule is the seeded stream of
``faults.kill_mean_s`` with ``kill_target = "any"`` (exponential inter-arrival times, each kill
one of the 2 workers and 2 shards, all alike), thinned: a kill less than ``MIN_GAP_S`` after the
previous one kept is skipped (so each kill is its own incident, though recoveries still
overlap: a shard takes ~2.5 s to restart, a worker ~5 s, a full rollback more); the first
``KILLS`` x scale at or after ``FIRST_KILL_S``, from the first seed (from 0) that kills at least
``MIN_EACH`` workers and ``MIN_EACH`` shards. Each arm gets the list as ``faults.kills``.

Per arm, from the run's own record (summary.json):

- kills made: the "killed" events the run logged; a kill is survived if the run completed and
  the killed process was recovered after it (a shard: a recovery of that shard; a worker: a
  restart of its rank, or a full recovery, which restarts every worker). A run that fails
  survives none of its kills (its cause is reported);
- chunks not exactly once: the work queue's final count of (epoch, chunk) items completed
  more than once plus those never completed (completed runs only; a rollback rolls the counts
  back with the data position, so a chunk trained again after it counts once);
- PLS (``recovery.pls``), samples redone by rollbacks (``recovery.samples_redone``), rows of
  the chunks that workers leased when they died (or were stopped with a dead one, where a
  group is rebuilt) and the queue gave out again (``queue.released_rows``: what those workers
  had trained of them is trained again, so at most these rows; how much they had trained died
  with them), pushes in flight lost to a dead shard (``recovery.lost_pushes``);
- stray processes: after the run returned (Ray shut down), the job's processes still alive
  ``leftovers.GRACE_S`` later (``leftovers.py``).

Ratios: ``kills_survived_frac`` (kills survived / kills made, all arms), ``chunks_not_exactly_once``
(sum over the arms that completed), ``stray_processes`` (sum), ``arms_failed``.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

from recsync.bench import overhead as ov
from recsync.bench.leftovers import GRACE_S, StrayCounter
from recsync.bench.memory import RssSampler
from recsync.bench.report import _table
from recsync.config import RunConfig, load_config
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec
from recsync.distributed.errors import RunFailed
from recsync.distributed.faults import fault_schedule
from recsync.metrics.plot import plot_runs
from recsync.run.driver import run as run_training

ROWS = 1_000_000  # training rows at --scale 1
EVAL_ROWS = 50_000
WORKERS, SHARDS, BATCH = 2, 2, 4096
CHUNK_BATCHES = 4
CHECKPOINT_EVERY_S = 5.0
KILLS = 12  # at --scale 1
KILL_MEAN_S = 2.0  # the stream before thinning
MIN_GAP_S = 1.5
FIRST_KILL_S = 15.0  # seconds after the first step: checkpoints exist by then
MIN_EACH = 3  # kills of workers and of shards, at least, at --scale 1
COMMON = [
    f"cluster.workers={WORKERS}", f"cluster.ps_shards={SHARDS}", f"train.batch_size={BATCH}",
    "train.threads=1", "train.eval_every_samples=1000000000000",
    f"data.chunk_rows={CHUNK_BATCHES * BATCH}", f"recovery.checkpoint_every_s={CHECKPOINT_EVERY_S}",
    "output.progress=false", "output.plot=false", "output.log_every_steps=1",
]


def _modes() -> dict:
    from recsync.modes import MODES  # here, not at import: `recsync bench` loads every scenario
    return {name: m for name, m in MODES.items() if name != "local"}


def recovery_kind(mode: str) -> str:
    """Partial recovery where the mode allows it, else full (lock-step shards)."""
    return "full" if _modes()[mode].lockstep else "partial"


def kill_schedule(scale: float) -> tuple[int, list[dict]]:
    """(seed, kills): see the module docstring. Each kill: {target, index, at_s}."""
    count = max(1, round(KILLS * scale))
    each = min(MIN_EACH, count // 2)
    for seed in range(1000):
        cfg = load_config(None, ['mode="async"', f"cluster.workers={WORKERS}",
                                 f"cluster.ps_shards={SHARDS}", f"faults.kill_mean_s={KILL_MEAN_S}",
                                 'faults.kill_target="any"', f"faults.seed={seed}"])
        kept: list[dict] = []
        for k in fault_schedule(cfg, horizon_s=1e6):
            if k.at_s < FIRST_KILL_S or (kept and k.at_s - kept[-1]["at_s"] < MIN_GAP_S):
                continue
            kept.append({"target": k.target, "index": k.index, "at_s": round(k.at_s, 1)})
            if len(kept) == count:
                break
        targets = [k["target"] for k in kept]
        if targets.count("worker") >= each and targets.count("ps") >= each:
            return seed, kept
    raise RuntimeError(f"no seed below 1000 kills {each} workers and {each} shards")


def arm_config(data: Path, mode: str, kills: list[dict]) -> RunConfig:
    listed = ", ".join(f'{{target="{k["target"]}", index={k["index"]}, at_s={k["at_s"]}}}'
                       for k in kills)
    return load_config(None, [f"data.path={json.dumps(str(data))}", f"mode={json.dumps(mode)}",
                              *COMMON, f'recovery.kind="{recovery_kind(mode)}"',
                              f"faults.kills=[{listed}]"])


# -- accounting: plain functions of a run's summary.json ---------------------------------------
def kill_outcomes(summary: dict, workers: int) -> list[dict]:
    """Each injected kill (the time it was made) with the time its process next served again
    (None: never): a shard, when its restarted process was ready (the partial or full
    recovery that followed); a worker, when a new process took its rank (a restart, or a full
    recovery's rollback, which starts every rank afresh). All in seconds since training
    started, on the driver's clock."""
    rec = summary.get("recovery") or {}
    shard_back = [(r["ready_s"], r["shard"]) for r in rec.get("recoveries", [])]
    worker_back = [(w["time_s"], set(w["restarted"])) for w in rec.get("worker_restarts", [])]
    worker_back += [(r["ready_s"], set(range(workers))) for r in rec.get("recoveries", [])
                    if r["kind"] == "full"]
    out = []
    for k in summary.get("failures", []):
        if not k.get("emulated"):
            continue
        t = k["time_s"]
        if k["target"] == "ps":
            back = [at for at, shard in shard_back if shard == k["index"] and at > t]
        else:
            back = [at for at, ranks in worker_back if k["index"] in ranks and at > t]
        out.append({"time_s": t, "target": k["target"], "index": k["index"],
                    "recovered_s": min(back) if back else None})
    return out


def chunks_not_exactly_once(summary: dict) -> int | None:
    """Items of the work queue completed more than once or never (None unless completed)."""
    q = summary.get("queue") or {}
    if summary.get("status") != "completed" or "completed_never" not in q:
        return None
    return q["completed_more_than_once"] + q["completed_never"]


def account(summary: dict, workers: int) -> dict:
    """The chaos figures of one arm from its summary."""
    kills = kill_outcomes(summary, workers)
    recovered = sum(1 for k in kills if k["recovered_s"] is not None)
    completed = summary.get("status") == "completed"
    rec = summary.get("recovery") or {}
    return {
        "status": summary.get("status"), "error": summary.get("error"),
        "kills": kills, "kills_made": len(kills),
        "kills_made_workers": sum(1 for k in kills if k["target"] == "worker"),
        "kills_made_shards": sum(1 for k in kills if k["target"] == "ps"),
        "kills_recovered": recovered, "kills_survived": recovered if completed else 0,
        "chunks_not_exactly_once": chunks_not_exactly_once(summary),
        "pls": rec.get("pls"), "samples_redone": rec.get("samples_redone"),
        "rows_requeued": (summary.get("queue") or {}).get("released_rows"),
        "lost_pushes": rec.get("lost_pushes"),
    }


# -- running the arms --------------------------------------------------------------------------
def run_arm(cfg: RunConfig, out_dir: Path, name: str) -> dict:
    """One ``run.run``; a failed run is an arm's result too (its summary says why)."""
    strays = StrayCounter()
    strays.before_run()
    traceback_text = None
    (Path(out_dir) / "summary.json").unlink(missing_ok=True)  # never an earlier run's
    with ov.embedded_ray(), RssSampler() as sampler:
        try:
            run_training(cfg, out_dir, overwrite=True)
        except RunFailed:
            pass  # summary.json has the status and the cause
        except Exception:  # a bug the kills found: one arm's result, not the scenario's end
            traceback_text = traceback.format_exc(limit=6)  # summary.json has its first line
    summary = json.loads((Path(out_dir) / "summary.json").read_text())
    if traceback_text:
        summary["traceback"] = traceback_text
    left = strays.after_run(sampler.per_process)
    chaos = {**account(summary, cfg.cluster.workers), "kills_scheduled": len(cfg.faults.kills),
             "strays": left["strays"],
             "stray_processes": len(left["strays"]), "stray_wait_s": left["waited_s"]}
    print(f"  {name}: {chaos['status']}; kills survived {chaos['kills_survived']} of "
          f"{chaos['kills_made']}; chunks not exactly once {chaos['chunks_not_exactly_once']}; "
          f"PLS {chaos['pls']}; stray processes {chaos['stray_processes']}"
          + (f"\n    cause: {str(chaos['error']).splitlines()[0]}" if chaos["error"] else ""),
          flush=True)
    return {**summary, "chaos": chaos, "out_dir": str(out_dir)}


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    modes = list(_modes())
    data = ov.make_data(out / "data", max(100_000, round(ROWS * scale)),
                        SynthSpec().max_table_rows, EVAL_ROWS)
    seed, kills = kill_schedule(scale)
    print(f"kill schedule (seed {seed}, EMULATED): "
          + ", ".join(f"{k['target']} {k['index']} at {k['at_s']} s" for k in kills), flush=True)
    cfgs = {m: arm_config(data, m, kills) for m in modes}
    rows = Dataset(data).rows("train")
    arms = {}
    for m, cfg in cfgs.items():
        print(f"{m} (recovery {recovery_kind(m)}) ...", flush=True)
        arms[m] = run_arm(cfg, out / "arms" / m, m)
    done = [m for m in modes if (out / "arms" / m / "metrics.jsonl").exists()]
    if done:
        plot_runs([out / "arms" / m for m in done], out / "quality.png", labels=done)
    chaos = {m: a["chaos"] for m, a in arms.items()}
    made = sum(c["kills_made"] for c in chaos.values())
    ratios = {
        "kills_survived_frac": (sum(c["kills_survived"] for c in chaos.values()) / made
                                if made else float("nan")),
        "chunks_not_exactly_once": sum(c["chunks_not_exactly_once"] or 0
                                       for c in chaos.values()),
        "stray_processes": sum(c["stray_processes"] for c in chaos.values()),
        "arms_failed": sum(1 for c in chaos.values() if c["status"] != "completed"),
    }
    wall_s = time.perf_counter() - started
    return {
        "scenario": "chaos",
        "description": _description(modes, rows, seed, kills, wall_s) + "\n\n## Per mode\n\n"
        + per_mode_table(arms),
        "arms": arms,
        "ratios": ratios,
        "kill_schedule": {"seed": seed, "kills": kills, "emulated": True,
                          "kill_mean_s": KILL_MEAN_S, "min_gap_s": MIN_GAP_S},
        "wall_s": wall_s,
        "tables": {"Kills and recoveries (seconds since training started)":
                   [row for m, a in arms.items() for row in _kill_rows(m, a)]},
        "configs": {f"{m} (recsync config)": cfg.to_toml() for m, cfg in cfgs.items()},
    }


# -- the report --------------------------------------------------------------------------------
def _description(modes: list[str], rows: int, seed: int, kills: list[dict], wall_s: float) -> str:
    return (
        f"Every mode of the registry ({', '.join(modes)}) with {WORKERS} workers x batch {BATCH} "
        f"and {SHARDS} PS shards, one pass over the same {rows:,} synthetic rows; default DLRM, "
        f"optimizers and mode settings; 1 intra-op thread per process; chunks of "
        f"{CHUNK_BATCHES} batches; a checkpoint round every {CHECKPOINT_EVERY_S:g} s. Recovery "
        f"partial where the mode allows it, else full ("
        + ", ".join(m for m in modes if recovery_kind(m) == "full") + "). "
        f"FAILURES INJECTED (EMULATED): {len(kills)} processes killed (os._exit), due at the same "
        f"times since the start of training in every arm: "
        + ", ".join(f"{'worker' if k['target'] == 'worker' else 'shard'} {k['index']} at "
                    f"{k['at_s']} s" for k in kills)
        + f" (seed {seed} of faults.kill_mean_s = {KILL_MEAN_S:g} s over any of the "
        f"{WORKERS + SHARDS} processes, a kill less than {MIN_GAP_S:g} s after the previous "
        f"kept one skipped, the first {len(kills)} from {FIRST_KILL_S:g} s); a kill due while "
        f"its process is still down from an earlier one waits until it is back, so a kill is "
        f"made later than due when the driver was busy recovering. A kill is "
        f"survived if the run completed and the process was recovered after it; chunks not "
        f"exactly once: the work queue's final counts (completed runs); samples redone: by "
        f"full-recovery rollbacks; rows requeued: rows of the chunks leased by workers that died "
        f"(or were stopped with them, where a group is rebuilt), given out again (what those "
        f"workers had trained of them is trained twice: at most these rows); stray processes: "
        f"the job's processes alive "
        f"{GRACE_S:g} s after the run returned and Ray shut down. One run per mode; all "
        f"processes share the machine's cores. Scenario wall time {wall_s / 60:.1f} min.")


def per_mode_table(arms: dict) -> str:
    rows = []
    for m, a in arms.items():
        c = a["chaos"]
        rows.append([
            m, (a.get("recovery") or {}).get("kind"), c["status"],
            f"{c['kills_survived']} / {c['kills_made']} ({c['kills_scheduled']})",
            f"{c['kills_made_workers']} / {c['kills_made_shards']}",
            c["chunks_not_exactly_once"], c["pls"], c["samples_redone"],
            c["rows_requeued"], c["lost_pushes"], c["stray_processes"],
            (a.get("eval") or {}).get("auc"), a.get("wall_s")])
    return _table(["mode", "recovery", "status", "kills survived / made (scheduled)",
                   "kills of workers / shards", "chunks not exactly once", "PLS",
                   "samples redone (rollbacks)", "rows requeued (worker deaths)",
                   "lost pushes",
                   "stray processes", "eval AUC", "wall s"], rows)


def _kill_rows(mode: str, a: dict) -> list[list]:
    c = a["chaos"]
    rows = [[f"{mode}: {k['target']} {k['index']} killed at {k['time_s']:.1f} s",
             k["recovered_s"], "recovered at (s)" if k["recovered_s"] is not None
             else "not recovered"] for k in c["kills"]]
    if c["error"]:
        rows.append([f"{mode}: {c['status']}", None, str(c["error"]).splitlines()[0][:300]])
    for s in c["strays"]:
        rows.append([f"{mode}: stray pid {s['pid']}", None, f"{s['why']}: {s['cmdline']}"])
    return rows
