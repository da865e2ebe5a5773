"""What a failure means: a plain function from what the driver sees (worker and shard statuses)
to one ``Decision``. No Ray here; ``actions`` carries decisions out on the run.

- A worker died, by the mode's ``worker_death``: REPLACE (a fresh worker takes its rank; its
  leased chunk went back to the queue; where the workers form a group every worker restarts on
  a new one), REBUILD_GROUP (every worker restarts at the step the PS completed, from a live
  replica's dense state as of that step; the shards forget the incomplete step), FROM_REPLICA
  (the dead ranks, or all where there is a group, restart from a live replica's dense
  parameters).
- A PS shard came back (Ray restarted it from its own last checkpoint): partial recovery goes
  on and logs what was lost; full recovery rolls everything back to the last job checkpoint.
  A lockstep mode's shards apply each step together, so one shard set back alone would stall
  the others: there it is rolled back with everything else, as full recovery does.
- A shard is gone for good, a worker failed, a crash loop, no replica left: abort, saying why.
- At the end of a run (``ending``: the workers are done, or a call of the end met a dead
  actor) the same holds; a shard that is gone aborts even with every worker done, as the end
  needs every shard (distributed/ending.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from recsync.distributed.status import (ALIVE, DEAD, LEFT, PENDING, VACANT, ShardStatus,
                                       WorkerStatus)
from recsync.modes.base import FROM_REPLICA, REBUILD_GROUP, REPLACE

MAX_WORKER_RESTARTS = 20  # per run: a crash loop must end in an error, not go on forever


class Kind(str, Enum):
    CONTINUE = "continue"
    REPLACE_WORKERS = "replace_workers"  # fresh workers take ``ranks``
    REBUILD_GROUP = "rebuild_group"  # every rank restarts from ``source``'s per-step states
    RESTART_FROM_REPLICA = "restart_from_replica"  # ``ranks`` restart from ``source``'s params
    RELOAD_SHARD = "reload_shard"  # partial recovery: ``shards`` reloaded their own checkpoint
    ROLL_BACK = "roll_back"  # full recovery (``shards`` restarted) or the driver resumed
    ABORT = "abort"  # ``reason`` is the message


@dataclass(frozen=True)
class Decision:
    kind: Kind
    ranks: tuple[int, ...] = ()  # the workers to (re)start
    dead: tuple[int, ...] = ()  # the workers that died (or failed), for the event log
    source: int | None = None  # the live worker whose replica the new ones start from
    shards: tuple[int, ...] = ()  # the shards that restarted
    reason: str = ""  # ABORT: the error message; ROLL_BACK: "resume" or "shard restarted"

    @property
    def shard(self) -> int | None:
        return self.shards[0] if self.shards else None


CONTINUE = Decision(Kind.CONTINUE)


def recovery_kind(cfg) -> str:
    """The recovery the run starts with ("auto" goes on as partial until the first checkpoint
    round chooses; recsync/checkpoint/interval.py)."""
    return "partial" if cfg.recovery.kind == "auto" else cfg.recovery.kind


def decide(mode, cfg, workers: list[WorkerStatus], shards: list[ShardStatus], *,
           recovery: str | None = None, restarts: int = 0,
           resuming: bool = False, ending: str = "") -> Decision:
    """The one thing to do now. ``mode``: the facts (a ``recsync.modes.base.Mode`` subclass)
    of the mode the run is in; ``recovery``: the recovery in force (default from ``cfg``);
    ``restarts``: workers restarted so far in this run; ``resuming``: the run starts from a
    job checkpoint of an earlier run of it; ``ending``: the moment of the run's end it is asked
    at ("during the final evaluation"), which the abort's reason names."""
    recovery = recovery_kind(cfg) if recovery is None else recovery
    if resuming:
        return Decision(Kind.ROLL_BACK, reason="resume")
    restarted = tuple(s.index for s in shards if s.state == ALIVE and s.restarted)
    if restarted and recovery != "none":
        if recovery == "partial" and not mode.lockstep:
            return Decision(Kind.RELOAD_SHARD, shards=restarted)
        return Decision(Kind.ROLL_BACK, shards=restarted, reason="shard restarted")
    dead = [w.rank for w in workers if w.state == DEAD]
    errors = [w for w in workers if w.state == "error"]
    gone = [s for s in shards if s.state != ALIVE]
    if gone and (dead or errors or ending):
        return _abort(_shard_gone(gone[0], recovery, ending))
    if not dead and not errors:
        return CONTINUE
    if errors and not dead:
        return _abort(f"worker {errors[0].rank} failed: {errors[0].error}")
    failed = tuple(dead or [e.rank for e in errors])
    if restarts + len(failed) > MAX_WORKER_RESTARTS:
        return _abort(f"workers died {restarts + len(failed)} times; giving up (the last: "
                      f"{list(failed)}). Check the worker logs for the cause.")
    everyone = tuple(w.rank for w in workers)
    group = mode.needs_group(cfg)
    if mode.worker_death == REPLACE:
        return Decision(Kind.REPLACE_WORKERS, ranks=everyone if group else failed, dead=failed)
    live = [w.rank for w in workers  # an elastic run's vacant, pending or left ranks are not
            # (one whose group broke, in "error", still holds its replica)
            if w.rank not in failed and w.state not in (VACANT, PENDING, LEFT)]
    if not live:
        return _abort("every worker died at once; the dense replicas are lost")
    if mode.worker_death == REBUILD_GROUP:
        return Decision(Kind.REBUILD_GROUP, ranks=everyone, dead=failed, source=live[0])
    if mode.worker_death == FROM_REPLICA:
        return Decision(Kind.RESTART_FROM_REPLICA, ranks=everyone if group else failed,
                        dead=failed, source=live[0])
    raise ValueError(f"{mode.__name__}.worker_death = {mode.worker_death!r}: not one of "
                     f"{REPLACE!r}, {REBUILD_GROUP!r}, {FROM_REPLICA!r}")


def _shard_gone(s: ShardStatus, recovery: str, moment: str = "") -> str:
    cause = s.cause or ("died" if s.state == DEAD else "does not answer")
    if moment:
        cause = f"{cause} {moment}"
    if recovery != "none":
        return (f"parameter-server shard {s.index} {cause} and did not come back from its "
                f"checkpoint in time")
    return (f"parameter-server shard {s.index} {cause}; the run stops here (recovery.kind = "
            f"\"none\"; with recovery.kind = \"partial\" or \"full\" and "
            f"recovery.checkpoint_every_s > 0 the run goes on from checkpoints)")


def _abort(message: str) -> Decision:
    return Decision(Kind.ABORT, reason=message)
