"""A planned move of PS shards off a node drained with notice (`recsync scale RUN_DIR
--drain-node ID`): every worker pauses after a step (its pushes applied), so the shards' pushes
stop; what the shards' rules still hold is applied (gba's partial global batch); a
checkpoint round writes every shard's state as it is now; the moved shards' processes end, a
standby on another node takes each over from that checkpoint, as it takes over a shard that
failed (ps/standby.py), and the workers are pointed at the new processes before they go on.
Nothing applied is lost: the take-over restores the version the shard had when it stopped
(PLS 0). The watch loop sees the shard's new process as for any failure and logs the recovery,
marked planned, with its downtime (from the old process's end to the first pull the new one
served).

A move needs a standby (``recovery.kind = "partial"``, one standby at least) that is not on a
drained node, full checkpoints (``recovery.rows = "all"``), and a mode whose pause stops every
call to the shards (``Mode.quiet_when_paused``); without them the move is refused, saying why,
and the shard stays where it is. A move that cannot happen now (the workers do not pause, a
standby is being started, a shard does not answer) is tried again at the next poll.
"""

from __future__ import annotations

import time

from recsync.distributed.actors import ACTOR_GONE
from recsync.modes import MODES

WRITE_TIMEOUT_S = 300  # the moved shards' checkpoint must be on disk before they end
NO_STANDBY = "no standby is waiting now (one is being started)"


def refusal(cfg, standby_nodes: list[str], drained: set[str]) -> str | None:
    """Why a shard cannot move now (None: it can). ``standby_nodes``: the node of each waiting
    standby, the next one to take over first."""
    r = cfg.recovery
    if r.kind != "partial" or r.standbys < 1:
        return ("a planned move needs a standby to take the shard over: recovery.kind = "
                "\"partial\" with recovery.checkpoint_every_s (and recovery.standby_shards not 0)")
    if r.rows != "all":
        return (f"recovery.rows = \"{r.rows}\" checkpoints part of the rows; a move would lose "
                f"the others")
    if not MODES[cfg.mode].quiet_when_paused(cfg):
        return (f"mode {cfg.mode!r} at these settings calls the shards while its workers are "
                f"paused (a background round, Hogwild threads: a move could lose an update), "
                f"or its workers cannot all pause (rounds inside training)")
    if not standby_nodes:
        return NO_STANDBY
    if standby_nodes[0] in drained:
        return f"the next standby is on a drained node too ({standby_nodes[0][:8]})"
    return None


def move_shards(run, drained: set[str], busy: bool) -> dict | None:
    """Move the shards on ``drained`` nodes. Returns the move's record ({"shards", "refused",
    "versions", "paused_s"}; "shards" empty: none is there), or None to try again at the next
    poll. ``busy``: a worker is leaving or done, so the workers cannot all pause now."""
    actors, record = run.actors, run.record
    try:
        shards = [i for i, node in actors.shard_nodes().items() if node in drained]
        standbys = actors.standby_nodes() if shards else []
    except ACTOR_GONE:  # a shard is down: its recovery comes first
        return None
    if not shards:
        return {"shards": [], "refused": None}
    why = refusal(run.cfg, standbys, drained)
    if why == NO_STANDBY or (why is None and busy):
        return None
    if why is not None:
        record.event(run_time(run), f"shard(s) {shards} on a drained node stay there: {why}")
        print(f"elastic: shard(s) {shards} cannot move: {why}", flush=True)
        return {"shards": shards, "refused": why}
    begin = time.time()
    if not run.pause_all(f"moving shard(s) {shards}"):
        return None
    try:
        actors.shard_call("end")  # what the rules hold applied (gba's partial global batch),
        # on every shard alike: the shards keep applying the same updates
        ckpt = run.rounds.take()
        if ckpt is None or any(ckpt["sequences"][i] is None for i in shards):
            return None
        run.rounds.log(ckpt, run_time(run), training=False)
        for i in shards:
            actors.wait_written(i, ckpt["sequences"][i], WRITE_TIMEOUT_S)
        versions = {i: ckpt["versions"][i] for i in shards}
        for i in shards:  # its process ends; a standby takes it over from that checkpoint
            run.shard_watch.move_planned(i, versions[i])
            run.shard_watch.killed("ps", i, time.time())  # its pushes' downtime starts
            actors.stop_shard(i)
        actors.take_over(shards)  # waited for, and the workers told where the shards are now
    except ACTOR_GONE:  # a worker or shard died meanwhile: its recovery comes first
        return None
    finally:
        actors.resume_all()
    record.event(run_time(run), f"shard(s) {shards} moved off a drained node: checkpoint at "
                                f"version(s) {list(versions.values())}, taken over by standbys")
    print(f"elastic: shard(s) {shards} moved off a drained node", flush=True)
    return {"shards": shards, "versions": versions, "paused_s": time.time() - begin,
            "refused": None}


def run_time(run, unix: float | None = None) -> float:
    """Seconds of training at ``unix`` (default: now), on the run's clock."""
    return max(0.0, (time.time() if unix is None else unix) - run.tallies.start_unix)
