"""Scenario `elastic`: an elastic run (``cluster.workers = [2, 4]``) on the EMULATED cluster
whose worker count goes 4 -> 2 -> 4 while it trains, against runs of a fixed 4 and 2 workers;
and a PS shard moved off a drained node of a loopback Ray cluster.

Arms (mode async, 1 PS shard, the same synthetic data (emulated.BENCH_SPEC), model and
settings; each worker and the shard paced as a machine of ``CORES_PER_WORKER`` and
``CORES_PER_SHARD`` cores, so that throughput follows the number of workers as on separate
machines):

- ``fixed_4w``, ``fixed_2w``: 4 and 2 workers for the whole pass;
- ``elastic``: ``workers = [2, 4]``; `recsync scale` (run/scale.py, as a user would) asks for 2
  workers once a third of the samples are trained and for 4 again at two thirds;
- ``shard_move``: a Ray cluster of two nodes on this machine (``ray.cluster_utils``): async,
  ``workers = [1, 2]``, 2 shards, partial recovery with a standby; once a third of the samples
  are trained, the node holding a shard (and not the standby) is drained
  (`recsync scale --drain-node`): its shard moves (distributed/shard_move.py). Not emulated.
- the sync part (bench/elastic_sync.py): sync 4 -> 2 -> 4 workers against a fixed 4, 3 seeds,
  the eval AUC compared. Not emulated.

``ROUNDS`` rounds of the three arms, interleaved. Figures: each phase's samples/s (the metrics
lines of the phase, less the first ``SETTLE_LINES`` after the change (0.5 s each) and the
last, median) over the fixed run's of that size (median of its lines after the same warm-up); the time from the scale-up request to
the first step of the last new worker (a worker process started, torch imported, model built:
what a node's arrival costs); each drain's duration (told to leave -> left, its chunk
finished); chunks completed other than exactly once; the moved shard's PLS, lost updates and
pushes, and the downtime of its pushes.

Ratios: ``phase_speed_vs_fixed_min``, ``chunks_not_exactly_once``, ``join_to_first_step_s``,
``drain_s`` (the longest), ``shard_move_pls``; a phase's ratio is the median of the rounds'.
The sync part's: ``scaled_sync_minus_fixed_auc`` (mean of the seeds),
``scaled_sync_scaled_as_asked``, ``sync_formation_pause_s`` (the longest).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench.elastic_move import run_shard_move
from recsync.bench.elastic_sync import run_sync_quality
from recsync.config import RunConfig, load_config
from recsync.metrics.plot import plot_runs
from recsync.run import scale as scale_requests
from recsync.run.driver import run as run_training

BATCH = 512
# the shard at about half its time busy with 4 workers (at 0.4 cores it was 0.71 busy, close
# enough to saturation that the 4-worker speed swung 20% between runs)
CORES_PER_WORKER, CORES_PER_SHARD = 0.2, 0.6
ROUNDS = 2
ROWS = 1_000_000  # training rows at --scale 1: each phase lasts 20-30 s
EVAL_ROWS = 20_000
SETTLE_LINES = 6  # metrics lines (0.5 s each) after a change left out of a phase's speed
COMMON = [
    'mode="async"', "cluster.ps_shards=1", f"train.batch_size={BATCH}",
    "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]", f"data.chunk_rows={4 * BATCH}",
    "train.threads=1", "output.progress=false", "output.plot=false",
    "train.eval_every_samples=1000000000000",
    *em.emulation_args(CORES_PER_WORKER, CORES_PER_SHARD),
]
ARMS = {"fixed_4w": ["cluster.workers=4"], "fixed_2w": ["cluster.workers=2"],
        "elastic": ["cluster.workers=[2, 4]"]}
PHASES = ((1 / 3, 2), (2 / 3, 4))  # (fraction of the samples, workers asked for)
PHASE_WORKERS = (4, 2, 4)  # the elastic run's phases: it starts at its max


def lines(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def last_line(out: Path) -> dict | None:
    """The last whole metrics line, read from the file's end (cheap: the scale thread shares
    the driver's process and the machine with the run it measures)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return None
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 65536))
        tail = f.read().decode(errors="replace").splitlines()
    for text in reversed(tail):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            continue  # a line being written, or the first, cut
    return None


def ask_at(out: Path, total: int, steps, drain: str | None = None) -> threading.Thread:
    """A thread that asks the run in ``out`` for each (fraction, workers) of ``steps`` once that
    fraction of ``total`` samples is trained (``drain``: a node to drain instead)."""
    def go():
        for fraction, workers in steps:
            while True:
                last = last_line(out)
                if (out / "summary.json").exists():
                    return
                if last and last["samples"] >= fraction * total:
                    break
                time.sleep(0.5)
            if drain is not None:
                scale_requests.ask(out, drain_nodes=[drain])
            else:
                scale_requests.ask(out, workers=workers)
    thread = threading.Thread(target=go, name="bench-scale", daemon=True)
    thread.start()
    return thread


def phases(records: list[dict]) -> list[dict]:
    """The runs of metrics lines with one worker count: {workers, from_s, to_s, speed}."""
    out: list[dict] = []
    for r in records:
        if r["samples"] == 0:
            continue
        if not out or out[-1]["workers"] != r["workers"]:
            out.append({"workers": r["workers"], "lines": []})
        out[-1]["lines"].append(r)
    for p in out:
        kept = p["lines"][SETTLE_LINES:-1]
        p["from_s"], p["to_s"] = p["lines"][0]["time_s"], p["lines"][-1]["time_s"]
        p["speed"] = statistics.median(x["samples_per_s"] for x in kept) if kept else None
        p["lines"] = len(p["lines"])
    return out


def arm_config(data: Path, extra: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *extra])


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    rows = max(50_000, round(ROWS * scale))
    data = em.make_data(out / "data", rows, EVAL_ROWS)
    cfgs = {name: arm_config(data, extra) for name, extra in ARMS.items()}
    rounds = [{name: _arm(cfg, out / f"round{k}" / name, rows) for name, cfg in cfgs.items()}
              for k in range(ROUNDS)]
    move = run_shard_move(out / "shard_move", data, rows)
    sync = run_sync_quality(out / "sync", data, rows, run_scaled)
    per_round = [_phase_ratios(r) for r in rounds]
    # each phase's ratio, median of the rounds that measured all three phases
    measured = [r for r in per_round if r is not None]
    vs_fixed = ([statistics.median(r[i] for r in measured) for i in range(len(PHASE_WORKERS))]
                if measured else [])
    sections = [r["elastic"]["summary"]["elastic"] for r in rounds]
    joins = [j for j in map(join_to_first_step_s, sections) if j is not None]
    drains = [e["drain_s_max"] for e in sections if e["drain_s_max"] is not None]
    ratios = {
        "phase_speed_vs_fixed_min": min(vs_fixed) if vs_fixed else None,
        "chunks_not_exactly_once": sum(
            a["summary"]["queue"]["completed_more_than_once"]
            + a["summary"]["queue"]["completed_never"] for r in rounds for a in r.values()
            if a["summary"]["status"] == "completed"),
        "join_to_first_step_s": max(joins) if joins else None,
        "drain_s": max(drains) if drains else None,
        "shard_move_pls": move.get("pls"),
        **sync["ratios"],
    }
    plot_runs([out / "round0" / n for n in ARMS], out / "elastic.png", list(ARMS))
    wall_s = time.perf_counter() - started
    arms = {name: {"samples_per_s": statistics.median(r[name]["samples_per_s"] for r in rounds),
                   "rounds_samples_per_s": [r[name]["samples_per_s"] for r in rounds],
                   "auc": statistics.mean(r[name]["auc"] for r in rounds),
                   "eval_rows": rounds[0][name]["eval_rows"],
                   "phases": [r[name]["phases"] for r in rounds]} for name in ARMS}
    arms["shard_move"] = move
    return {
        "scenario": "elastic",
        "emulation_label": (f"EMULATED cluster: workers x {CORES_PER_WORKER:g} cores, 1 shard x "
                            f"{CORES_PER_SHARD:g} cores (arms fixed_4w, fixed_2w, elastic); "
                            f"arm shard_move: a real 2-node Ray cluster on this machine, not "
                            f"emulated"),
        "description": (
            f"{rows:,} training rows (one pass), batch {BATCH} per worker, mode async, "
            f"{ROUNDS} rounds of the three arms, interleaved. Phase speeds leave out the first "
            f"{SETTLE_LINES} metrics lines (0.5 s each) after a change; each phase is held "
            f"against the fixed run of its size in the same round. Per round: "
            + " | ".join(_round_text(k, r) for k, r in enumerate(rounds))
            + f". Phase ratios per round (4, 2, 4 workers): {per_round}. The sync part: "
              f"{sync['text']}. Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms, "ratios": ratios, "wall_s": wall_s, "elastic": sections,
        "phase_ratios_per_round": per_round, "sync": sync,
        "configs": {f"{n} (recsync config)": c.to_toml() for n, c in cfgs.items()},
    }


def run_scaled(cfg: RunConfig, run_dir: Path, rows: int) -> dict:
    """One run in ``run_dir`` (an elastic one asked for each worker count of PHASES as the
    run passes its fraction of ``rows``); its summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"[elastic] {run_dir.parent.name} {run_dir.name} ...", flush=True)
    thread = ask_at(run_dir, rows, PHASES) if cfg.cluster.elastic else None
    summary = run_training(cfg, run_dir, overwrite=True)
    if thread is not None:
        thread.join(timeout=5)
    return summary


def _arm(cfg: RunConfig, run_dir: Path, rows: int) -> dict:
    """One run of an arm (the elastic one scaled as PHASES say); what the report needs."""
    summary = run_scaled(cfg, run_dir, rows)
    return {"samples_per_s": summary["samples_per_s"], "summary": summary,
            "auc": summary["eval"]["auc"], "eval_rows": summary["eval"]["rows"],
            "phases": phases(lines(run_dir)), "status": summary["status"]}


def _phase_ratios(arms: dict) -> list[float] | None:
    """One round's elastic phases' speeds over its fixed runs' of the same size (None unless
    all three phases were measured)."""
    fixed = {4: _steady(arms["fixed_4w"]["phases"]), 2: _steady(arms["fixed_2w"]["phases"])}
    measured = [p for p in arms["elastic"]["phases"] if p["speed"] is not None]
    if [p["workers"] for p in measured] != list(PHASE_WORKERS) or not all(fixed.values()):
        return None
    return [p["speed"] / fixed[p["workers"]] for p in measured]


def _round_text(k: int, arms: dict) -> str:
    fixed = {n: _steady(arms[f"fixed_{n}w"]["phases"]) for n in (4, 2)}
    measured = [p for p in arms["elastic"]["phases"] if p["speed"] is not None]
    return (f"round {k}: fixed 4 workers {fixed[4] or 0:.0f}, 2 workers {fixed[2] or 0:.0f} "
            f"samples/s; elastic "
            + ", ".join(f"{p['workers']} workers {p['from_s']:.0f}-{p['to_s']:.0f} s "
                        f"{p['speed']:.0f}" for p in measured))


def _steady(ph: list[dict]) -> float | None:
    """A fixed run's speed: its one phase's."""
    speeds = [p["speed"] for p in ph if p["speed"] is not None]
    return speeds[0] if len(speeds) == 1 else (max(speeds) if speeds else None)


def join_to_first_step_s(section: dict) -> float | None:
    """From the scale-up request to the first step of the last worker it brought."""
    ups = [r for r in section["requests"] if r.get("workers") == section["max"]]
    if not ups:
        return None
    asked = ups[-1]["asked_s"]
    firsts = [j["first_step_s"] for j in section["joins"]
              if j["started_s"] >= asked and j["first_step_s"] is not None]
    return max(firsts) - asked if firsts else None
