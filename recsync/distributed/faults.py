"""Injected failures (``[faults]``): the kill schedule, carrying it out, and how the driver words
an actor's death."""

from __future__ import annotations

import random

import ray


def fault_schedule(cfg, horizon_s: float = 86_400.0) -> list[tuple[float, str, int]]:
    """(time_s, target, index) of every injected kill: the listed ones, and if kill_mean_s > 0
    seeded exponential inter-arrival times over random targets."""
    f = cfg.faults
    kills = [(k.at_s, k.target, k.index) for k in f.kills]
    if f.kill_mean_s > 0:
        rng = random.Random(f.seed)
        count = cfg.cluster.workers if f.kill_target == "worker" else cfg.cluster.ps_shards
        at = rng.expovariate(1 / f.kill_mean_s)
        while at < horizon_s and len(kills) < 10_000:
            kills.append((at, f.kill_target, rng.randrange(count)))
            at += rng.expovariate(1 / f.kill_mean_s)
    return sorted(kills)


class FaultInjector:
    """Kills what the schedule says once its time (seconds of training) has come."""

    def __init__(self, cfg):
        self.kills = fault_schedule(cfg)

    def inject_due(self, run, elapsed_s: float) -> None:
        while self.kills and self.kills[0][0] <= elapsed_s:
            _, target, index = self.kills.pop(0)
            run.kill(target, index)
            run.record.event(elapsed_s, f"killed {target} {index}", emulated=True)


def death_cause(e: Exception) -> str:
    """Why an actor is gone, in a few words: the error its constructor raised (its last line),
    or that its process died."""
    if isinstance(e, ray.exceptions.GetTimeoutError):
        return "does not answer (5 s)"
    text = str(e)
    if "creation task" in text:  # Ray: "...died because of an error raised in its creation task"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return f"failed to start: {lines[-1]}"
    return "died"
