"""What the validation of scenario `simulated` (bench/simulated.py) reads off the real EMULATED
runs and the simulations it fits to them: compute per step, the steps' jitter, the shards' CPU
per call, the split of a worker's own CPU around its compute."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from recsync.metrics.core import read_jsonl
from recsync.simulation.timing import Timing

SHARD_COSTS = ("pull_s_per_row", "push_s_per_row", "pull_call_s", "push_call_s")  # Timing's


def real_compute_s(arm: dict) -> float:
    """The median compute time per step of a real run's workers (its metrics lines)."""
    lines = read_jsonl(Path(arm["out_dir"]) / "metrics.jsonl")
    values = [v for x in lines for v in x.get("worker_compute_s") or [] if v]
    return statistics.median(values)


def _steady_lines(arm: dict) -> list[tuple[int, list[float]]]:
    """(steps since the line before, each worker's log mean step time) of a real run's metrics
    lines with steps and every worker's step time, less the first two (the warm-up) and the
    last (a partial interval)."""
    points, before = [], None
    for x in read_jsonl(Path(arm["out_dir"]) / "metrics.jsonl"):
        step_s = x.get("worker_step_s") or []
        if before is not None and step_s and all(step_s) and x.get("step", 0) > before:
            points.append((x["step"] - before, [math.log(v) for v in step_s]))
        before = x.get("step")
    return points[2:-1]


def real_jitter(arms: list[dict]) -> float:
    """Timing.jitter measured on real runs of one worker: the spread of the log of a step's
    time. A metrics line holds the mean of its interval's k steps, whose log (steps drawn
    independently) varies by about jitter / sqrt(k) around the run's mean, so per run jitter^2
    is sum k (log mean - its k-weighted mean)^2 / (lines - 1), over ``_steady_lines``; the
    median over the runs (0 without 3 such lines). A drift of the whole machine counts as
    jitter here."""
    sigmas = []
    for arm in arms:
        points = [(k, logs[0]) for k, logs in _steady_lines(arm)]
        if len(points) < 3:
            continue
        mean = sum(k * v for k, v in points) / sum(k for k, _ in points)
        sigmas.append(math.sqrt(sum(k * (v - mean) ** 2 for k, v in points)
                                / (len(points) - 1)))
    return statistics.median(sigmas) if sigmas else 0.0


def real_jitter_common(arms: list[dict]) -> float:
    """Timing.jitter_common measured on real runs of several workers that do not wait for each
    other (async, gba): the correlation over ``_steady_lines`` of two workers' log mean step
    times (a variation of the host moves both, a worker's own moves its own), the mean over
    pairs of workers; the median over the runs, within [0, 1] (0 without 3 such lines)."""
    shares = []
    for arm in arms:
        logs = np.array([x for _, x in _steady_lines(arm)])
        if logs.ndim != 2 or len(logs) < 3 or logs.shape[1] < 2 or logs.std(0).min() < 1e-9:
            continue  # too few lines or workers, or steady lines: no correlation to read
        corr = np.corrcoef(logs.T)
        shares.append(float(corr[np.triu_indices(len(corr), 1)].mean()))
    return min(1.0, max(0.0, statistics.median(shares))) if shares else 0.0


def shard_cpu_per_call(run: dict, cores_per_shard: float = 1.0) -> float | None:
    """A run's shards' CPU per call (None without): a real EMULATED run's as their pacing
    charged it; a simulation's, its shards' busy time on its ``cores_per_shard``."""
    sim = run.get("simulated")
    if sim is not None:
        busy, calls = sum(sim.get("shard_busy_s") or []), sum(sim.get("shard_calls") or [])
        return busy * cores_per_shard / calls if calls else None
    shards = (run.get("emulation") or {}).get("shards") or []
    calls = sum(x["requests"] for x in shards)
    return sum(x["cpu_s"] for x in shards) / calls if calls else None


def shard_cpu_split(runs: list[dict]) -> tuple[float, float] | None:
    """(CPU s per call, CPU s per second of training) of real EMULATED runs' shards: a least
    squares fit of each shard's CPU = per call x its calls + per second x the run's train_s,
    over runs that differ in length (the same calls in fewer seconds at more workers). A
    shard process's other threads (Ray's) take CPU by the second, and the pacing charges it to
    the next call: read as a cost per call at one worker, it makes shards serving more workers
    too busy (Timing.shard_background). None where the runs do not tell the two apart or the
    fit is not positive."""
    rows = [(x["requests"], r["train_s"], x["cpu_s"]) for r in runs
            for x in ((r.get("emulation") or {}).get("shards") or [])
            if x.get("requests") and r.get("train_s")]
    if len({round(t, 3) for _, t, _ in rows}) < 2:
        return None
    a = np.array([[calls, t] for calls, t, _ in rows], dtype=float)
    (per_call, per_s), *_ = np.linalg.lstsq(a, np.array([c for *_, c in rows]), rcond=None)
    return (float(per_call), float(per_s)) if per_call > 0 and per_s >= 0 else None


def scaled_shards(timing: Timing, scale: float) -> Timing:
    """``timing`` with each of the shard's costs (per call, per row) times ``scale``."""
    return replace(timing, **{k: getattr(timing, k) * scale for k in SHARD_COSTS})


def real_pull_side_share(run: dict) -> float | None:
    """Of a real EMULATED run's workers' CPU outside their compute, the share their pacing
    charged before it (the pull's side of a step), or None."""
    workers = (run.get("emulation") or {}).get("workers") or []
    if not workers or any(w.get("pre_compute_cpu_s") is None for w in workers):
        return None
    pre = sum(w["pre_compute_cpu_s"] for w in workers)
    outside = sum(w["cpu_s"] - w["compute_cpu_s"] for w in workers)
    return pre / outside if outside > 0 else None


def real_side_cpu_s(run: dict) -> float | None:
    """A real EMULATED run's workers' CPU per step outside their compute (the pacing's
    charge: the pull's and the push's side of a step, Ray's threads in it), or None."""
    workers = (run.get("emulation") or {}).get("workers") or []
    steps = sum(w.get("steps") or 0 for w in workers)
    if not steps or any(w.get("compute_cpu_s") is None for w in workers):
        return None
    return sum(w["cpu_s"] - w["compute_cpu_s"] for w in workers) / steps


def run_sides(run: dict, calibrated: dict) -> dict:
    """Timing's pull_side_s and push_side_s for a simulation of the real ``run``: the sides
    fitted on one worker (``calibrated["sides"]``) times this run's workers' CPU per step
    outside the compute over the one-worker runs' (``calibrated["side_cpu_s"]``), as each
    simulation computes for as long as its real run did: what a worker's own CPU per step is
    at 2 and 4 workers is the real run's measurement (13% below to 12% above the one-worker
    runs' median in a run on the Intel VM: the machine's drift, the mode's cost at more
    workers), not the model's."""
    here, one = real_side_cpu_s(run), calibrated.get("side_cpu_s")
    ratio = here / one if here and one else 1.0
    return {k: v * ratio for k, v in calibrated["sides"].items()}


def pull_round_trip_s(run: dict) -> float | None:
    """A run's workers' mean pull round trip (the median over its workers): a real EMULATED
    run's wall seconds (summary.json ``emulation.workers``), a simulation's simulated seconds
    (``simulated.per_worker``); None where it has none."""
    sim = run.get("simulated")
    workers = (sim.get("per_worker") if sim is not None
               else (run.get("emulation") or {}).get("workers")) or []
    values = [w["pull_s"] for w in workers if w.get("pull_s") is not None]
    return statistics.median(values) if values else None
