"""A planned move of PS shards off a node drained with notice (`recsync scale RUN_DIR
--drain-node ID`): every worker pauses after a step (its pushes applied), so the shards' pushes
stop; a checkpoint round writes every shard's state as it is now; the moved shards' processes
exit, and a standby on another node takes each over from that checkpoint, as it takes over a
shard that failed (ps/standby.py); the workers go on. Nothing applied is lost: the take-over
restores the version the shard had when it stopped (PLS 0). The watch loop sees the shard's new
process as for any failure and logs the recovery, marked planned, with its downtime (from the
exit to the first pull the new process served).

A move needs a standby (``recovery.standby_shards``) that is not on a drained node, and full
checkpoints (``recovery.kind = "partial"`` with ``recovery.rows = "all"``); without them the
move is refused, saying why, and the shard stays where it is.
"""

from __future__ import annotations

import time

from recsync.distributed.errors import RunFailed

WRITE_TIMEOUT_S = 300  # the moved shards' checkpoint must be on disk before they exit


def refusal(cfg, standby_nodes: list[str | None], drained: set[str]) -> str | None:
    """Why a shard cannot move now (None: it can). ``standby_nodes``: the node of each waiting
    standby, the next one to take over first."""
    r = cfg.recovery
    if r.kind != "partial" or r.standby_shards < 1:
        return ("a planned move needs a standby to take the shard over: set recovery.kind = "
                "\"partial\", recovery.checkpoint_every_s and recovery.standby_shards >= 1")
    if r.rows != "all":
        return (f"recovery.rows = \"{r.rows}\" checkpoints part of the rows; a move would lose "
                f"the others")
    if not standby_nodes:
        return "no standby is waiting now (one is being started)"
    if standby_nodes[0] in drained:
        return f"the next standby is on a drained node too ({standby_nodes[0][:8]})"
    return None


def move_shards(run, shards: list[int], drained: set[str]) -> dict:
    """Move ``shards`` off their (drained) node. Returns what was done: {"shards", "version",
    "paused_s", "refused"}; the take-over itself is seen and logged by the watch loop."""
    actors, record = run.actors, run.record
    why = refusal(run.cfg, actors.standby_nodes(), drained)
    if why is not None:
        record.event(run_time(run), f"shard(s) {shards} on a drained node stay there: {why}")
        print(f"elastic: shard(s) {shards} cannot move: {why}", flush=True)
        return {"shards": shards, "refused": why}
    begin = time.time()
    if not run.pause_all(f"moving shard(s) {shards}"):
        return {"shards": shards, "refused": "the workers did not pause (the run is ending or "
                                             "recovering); asked again at the next poll",
                "retry": True}
    try:
        ckpt = run.rounds.take()
        if ckpt is None or any(ckpt["sequences"][i] is None for i in shards):
            raise RunFailed(f"moving shard(s) {shards}: their checkpoint was not taken")
        run.rounds.log(ckpt, run_time(run), training=False)
        for i in shards:
            actors.wait_written(i, ckpt["sequences"][i], WRITE_TIMEOUT_S)
        versions = {i: ckpt["versions"][i] for i in shards}
        for i in shards:  # its process ends; a standby takes it over from that checkpoint
            run.shard_watch.move_planned(i, versions[i])
            run.shard_watch.killed("ps", i, time.time())  # its pushes' downtime starts
            actors.stop_shard(i)
    finally:
        actors.resume_all()
    record.event(run_time(run), f"shard(s) {shards} move off a drained node: checkpoint at "
                                f"version(s) {list(versions.values())} written, processes "
                                f"stopped, standby take-over under way")
    print(f"elastic: shard(s) {shards} moving off a drained node", flush=True)
    return {"shards": shards, "versions": versions, "paused_s": time.time() - begin,
            "refused": None}


def run_time(run) -> float:
    return max(0.0, time.time() - run.tallies.start_unix)
