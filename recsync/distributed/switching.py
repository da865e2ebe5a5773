"""Switching between modes at run time (``[switching]``: a schedule, or the mode controller
watching per-worker compute times). Every worker pauses after a step with its pushes applied,
the dense parameters and optimizer state move to where the next mode keeps them (PS shard 0, or
the workers' replicas), the shards take up the next mode's rule, and the workers resume in it."""

from __future__ import annotations

import ray

from recsync.modes import MODES
from recsync.modes.controller import ModeController


class Switcher:
    """When a switch is due: the schedule's next entry, else the mode controller's decision."""

    def __init__(self, cfg):
        self.schedule = list(cfg.switching.schedule)
        self.controller = ModeController(cfg.switching) if cfg.switching.auto else None

    def due(self, mode: str, statuses, elapsed_s: float, step: int) -> tuple[str, str] | None:
        """(mode, cause) of a switch due now from mode ``mode``, or None."""
        while self.schedule and self.schedule[0].reached(elapsed_s, step):
            sw = self.schedule.pop(0)
            if sw.to != mode:
                return sw.to, f"schedule: switching.schedule says {sw.to} {sw.when}"
        if self.controller is None:
            return None
        return self.controller.observe(elapsed_s, mode, [s.compute_s for s in statuses],
                                       [s.compute_steps for s in statuses])

    def switched(self) -> None:
        """After a switch: the pause is no evidence either way."""
        if self.controller is not None:
            self.controller.reset()


def switch(actors, watch, to: str) -> bool:
    """Pause every worker of ``actors`` (actors.RunActors; ``watch``: the shard watch, for
    its pause) after a step, move the dense state, resume in mode ``to``. Returns False (and
    resumes in the same mode) if a worker finished meanwhile: the run is ending, and a group
    cannot be formed without it."""
    if not actors.pause_all(f"switching to {to}", watch):
        return False
    shard0 = actors.shards[0]
    if MODES[to].dense_on_ps:  # the replicas' dense state goes to shard 0
        dense = actors.dense_state(0, timeout=None)
        if dense is not None:
            t = actors.cfg.train
            ray.get(shard0.install_dense.remote(dense["params"], t.dense_optimizer, t.dense_lr,
                                                dense["optimizer"], t.dense_weight_decay,
                                                t.dense_warmup_steps))
        actors.use_mode(to)
        actors.resume_all(to)
    else:  # every gradient held is applied, and the replicas start from shard 0's state
        actors.shard_call("end")
        step = max(actors.shard_versions())
        actors.advance_shards(step)
        actors.use_mode(to)
        dense = ray.get(shard0.take_dense.remote())
        actors.resume_all(to, dense, step)
    return True


def log_switch(record, to: str, cause: str, elapsed_s: float) -> None:
    at = record.time_s()
    frm = record.modes[-1]["mode"]
    record.modes[-1]["to_s"] = at
    record.modes.append({"mode": to, "from_s": at, "to_s": None, "cause": cause})
    record.event(elapsed_s, f"switched {frm} -> {to}", cause=cause)
    print(f"switched {frm} -> {to} at {elapsed_s:.1f} s of training: {cause}", flush=True)
