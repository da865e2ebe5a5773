"""Injected failures (``[faults]``): the kill schedule, carrying it out, and how the driver words
an actor's death."""

from __future__ import annotations

import random
import time

import ray

from recsync.config_sections import KillConfig


def fault_schedule(cfg, horizon_s: float = 86_400.0) -> list[KillConfig]:
    """Every injected kill: the listed ones (at a time or at a step), and if kill_mean_s > 0
    seeded exponential inter-arrival times over random processes of ``kill_target`` (with
    "any", every worker and shard alike). The kills at a time come first, by time, then those
    at a step, by step."""
    f = cfg.faults
    kills = list(f.kills)
    if f.kill_mean_s > 0:
        rng = random.Random(f.seed)
        targets = ([("worker", i) for i in range(cfg.cluster.workers)]
                   if f.kill_target in ("worker", "any") else [])
        targets += ([("ps", i) for i in range(cfg.cluster.ps_shards)]
                    if f.kill_target in ("ps", "any") else [])
        at = rng.expovariate(1 / f.kill_mean_s)
        while at < horizon_s and len(kills) < 10_000:
            target, index = targets[rng.randrange(len(targets))]
            kills.append(KillConfig(target=target, index=index, at_s=at))
            at += rng.expovariate(1 / f.kill_mean_s)
    return sorted(kills, key=lambda k: (k.at_step, k.at_s))


class FaultInjector:
    """Kills what the schedule says once its time (seconds of training) or step (of the most
    advanced worker) has come. A kill whose process is still down from an earlier kill (a shard
    not recovered yet, a worker not restarted yet) waits until it is back: there is no running
    process to kill (a dead worker's handle reaches nothing; a call to a shard that Ray is
    restarting may be dropped, as the chaos scenario saw)."""

    def __init__(self, cfg):
        self.kills = fault_schedule(cfg)

    def inject_due(self, run, elapsed_s: float, step: int) -> None:
        """Carry out the kills due by ``elapsed_s`` seconds or ``step`` steps on ``run``
        (``kill``, ``is_down``), in order, and log each one made at the time it was made
        (seconds since training started: later than it was due if the driver was busy, e.g.
        with a recovery), with the point the schedule gave (``scheduled``: "at_s = 12.5" or
        "at_step = 40")."""
        start_unix = run.tallies.start_unix
        for kill in [k for k in self.kills if k.reached(elapsed_s, step)]:
            target, index = kill.target, kill.index
            if run.is_down(target, index):
                continue
            self.kills.remove(kill)
            if kill.during == "checkpoint_write":
                run.kill_in_next_write(index)
                run.record.event(time.time() - start_unix, f"armed: ps {index} exits in "
                                 f"its next checkpoint write", emulated=True, target=target,
                                 index=index, during="checkpoint_write", scheduled=kill.when)
                continue
            run.kill(target, index)
            run.record.event(time.time() - start_unix, f"killed {target} {index}",
                             emulated=True, target=target, index=index, scheduled=kill.when)


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
