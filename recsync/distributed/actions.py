"""Carrying out the policy's decisions (policy.py) on a DistributedRun, and logging them in the
run's record: workers replaced, a group rebuilt, replicas restarted, a shard's partial recovery
counted, everything rolled back to a job checkpoint (full recovery, or the driver resumed). The
arithmetic (the step a group restarts from, the work a recovery lost) is recovery_math.py's."""

from __future__ import annotations

import time

from recsync.checkpoint import files, job, reshard
from recsync.cluster.placement import node_alive, node_label
from recsync.distributed.errors import RunFailed
from recsync.distributed.policy import Decision, Kind
from recsync.distributed.recovery_math import lost_work_s, partial_loss, rebuild_point
from recsync.distributed.status import ShardStatus
from recsync.modes import MODES


def carry_out(run, d: Decision, shards: list[ShardStatus], elapsed_s: float,
              resume: files.Checkpoint | None = None) -> None:
    """Do what ``d`` says (``shards``: the statuses it was decided from; ``resume``: the job
    checkpoint a resumed run goes on from). Raises RunFailed for ABORT."""
    if d.kind is Kind.CONTINUE:
        return
    if d.kind is Kind.ABORT:
        raise RunFailed(d.reason)
    if d.kind is Kind.RELOAD_SHARD:
        for i in d.shards:
            run.shard_watch.acknowledge(shards[i])
            log_partial_recovery(run, shards[i], elapsed_s)
        return
    if d.kind is Kind.ROLL_BACK:
        if resume is not None:
            resume_from(run, resume)
            return
        for i in d.shards:
            run.shard_watch.acknowledge(shards[i])
        for i in d.shards:
            full_recovery(run, i, elapsed_s)
        return
    dead = list(d.dead)
    elastic = run.elastic is not None and d.kind in (Kind.REPLACE_WORKERS,
                                                     Kind.RESTART_FROM_REPLICA,
                                                     Kind.REBUILD_GROUP)
    if not elastic:  # an elastic run counts its deaths in a window of time (elastic.py)
        run.tallies.count_restarts(len(d.dead))
    if elastic:
        what = run.elastic.lost(run, dead, d)  # goes on with fewer; new ones asked for
    elif d.kind is Kind.REPLACE_WORKERS:
        what = replace_workers(run, d, dead)
    elif d.kind is Kind.REBUILD_GROUP:
        what = rebuild_group(run, d, dead)
    elif d.kind is Kind.RESTART_FROM_REPLICA:
        what = restart_from_replica(run, d, dead)
    else:
        raise ValueError(f"no action for {d.kind}")
    run.record.event(time.time() - run.tallies.start_unix, what, dead=dead,
                     restarted=list(d.ranks))


def replace_workers(run, d: Decision, dead: list[int]) -> str:
    """Fresh workers take the ranks; their leased chunks went back to the queue."""
    run.restart(list(d.ranks))
    if list(d.ranks) == dead:
        return f"worker(s) {dead} died; restarted, their chunks requeued"
    why = " (switching is on)" if run.cfg.switching.enabled else ""
    return (f"worker(s) {dead} died; every worker restarted on a new group{why}, chunks "
            f"requeued")


def rebuild_group(run, d: Decision, dead: list[int]) -> str:
    """Every worker restarts on a new group (restart_group)."""
    step, lagging = restart_group(run, d.source, list(d.ranks), list(d.ranks))
    return (f"worker(s) {dead} died; {run.actors.mode} group rebuilt at step {step} from worker "
            f"{d.source}'s replica, chunks requeued"
            + (f"; shard(s) {lagging} had not completed step {step - 1} and skip its row "
               f"update" if lagging else ""))


def restart_group(run, source: int, retired: list[int], members: list[int]) -> tuple:
    """A live replica's (``source``'s) dense state as of its current step and the one before;
    then workers ``retired`` are retired, so no worker is left to push, the PS forgets the
    incomplete step, and the step it completed decides which state fresh workers for
    ``members`` start from on a new group (recovery_math.rebuild_point), the shards' step
    barriers waiting for them all (an elastic run's). Returns (that step, the shards that
    skipped its rows)."""
    actors = run.actors
    states = actors.recovery_states(source)
    run.retire(retired)
    actors.shard_call("drop_incomplete")
    step, lagging, known = rebuild_point(actors.shard_versions(), states)
    if not known:
        raise RunFailed(f"cannot rebuild the {actors.mode} group: the PS completed step {step}, "
                        f"worker {source}'s replica knows steps {sorted(states)}")
    actors.advance_shards(step, lagging)
    if run.elastic is not None:  # a group of another size (regroup.py)
        actors.shard_call("resize", len(members))
    run.start_workers(members, states[step], step)
    return step, lagging


def restart_from_replica(run, d: Decision, dead: list[int]) -> str:
    """The dense replicas restart from a live one's parameters (their optimizer state starts
    afresh)."""
    params = run.actors.dense_state(d.source, timeout=30)["params"]
    ranks = list(d.ranks)
    run.restart(ranks, {"params": params, "optimizer": None})
    return (f"worker(s) {dead} died; worker(s) {ranks} restarted from worker {d.source}'s "
            f"dense replica (dense optimizer state reset), chunks requeued")


def log_partial_recovery(run, s: ShardStatus, elapsed_s: float) -> None:
    """A shard came back from its own last checkpoint: the updates it had applied since (from
    the checkpoint's version to the last version the driver saw, at most half a second before
    it died) are lost, each one update's samples: counted for PLS."""
    record, cfg, restored = run.record, run.cfg, s.restored
    planned = run.shard_watch.planned.pop(s.index, None)  # a move: its exact version then
    lost_updates, lost = partial_loss(s.version_before if planned is None else planned,
                                      restored["version"],
                                      MODES[cfg.mode].samples_per_update(cfg))
    killed = run.shard_watch.recovered(s.index, s.ready_unix)
    start_unix = run.tallies.start_unix
    rec = {"kind": "partial", "time_s": elapsed_s, "shard": s.index,
           "ready_s": s.ready_unix - start_unix, "lost_updates": lost_updates,
           "lost_samples": lost, "version_before": s.version_before, "lost_work_s": 0.0,
           "standby": run.actors.directory is not None, **restored,
           "node_before": s.node_before, "node": s.node,
           "node_before_alive": node_alive((s.node_before or {}).get("node_id")),
           "planned": planned is not None, "version_at_move": planned}
    record.recoveries.append(rec)
    run.shard_watch.downtime_starts(s.index, rec, killed, s.ready_unix, s.first_pull_unix,
                                    start_unix)
    if planned is None:  # a planned move is no failure (checkpoint/interval.py's MTBF)
        run.rounds.failed(elapsed_s)
    what = (f"checkpoint {restored['sequence']} (version {restored['version']})"
            if restored["sequence"] is not None else "nothing (no checkpoint yet: from scratch)")
    record.event(elapsed_s, (
        ("planned move (partial recovery): " if planned is not None else "partial recovery: ")
        + f"shard {s.index}{_on(s.node_before, rec['node_before_alive'])} "
        f"restarted{_on(s.node)} from {what}; its {lost_updates:,} updates since "
        f"(~{lost:,} samples) are lost")
        + (f"; skipped: {restored['skipped']}" if restored["skipped"] else ""))
    print(f"{'planned move' if planned is not None else 'partial recovery'}: shard {s.index} "
          f"restarted from {what} at {elapsed_s:.1f} s", flush=True)


def _on(node: dict | None, alive: bool | None = None) -> str:
    """" on node 10.0.0.2 (1a2b3c4d)", with ", down" where the cluster lists it dead."""
    return f" on node {node_label(node, down=alive is False)}" if node else ""


def full_recovery(run, shard: int, elapsed_s: float) -> None:
    """A shard came back (Ray restarted it): roll every shard, the data position and the
    workers back to the newest job checkpoint that loads whole. The work since (from the later
    of that checkpoint and the previous rollback to the failure) is done again."""
    record, tallies, checkpoint_dir = run.record, run.tallies, run.actors.checkpoint_dir
    run.rounds.flush()
    ckpt, skipped = job.restorable(checkpoint_dir)
    if ckpt is None:
        raise RunFailed(f"full recovery after shard {shard} died: no complete job checkpoint in "
                        f"{checkpoint_dir}" + (f" ({'; '.join(skipped)})" if skipped else ""))
    now = time.time()
    killed = run.shard_watch.recovered(shard, now)
    redone = max(0, record.samples - ckpt.meta["samples"])
    lost_s = lost_work_s(redone, tallies.rate_before(killed), killed, ckpt.meta["unix"],
                         tallies.resumed_unix)
    rolled_back = time.time()
    loaded = roll_back(run, ckpt)
    tallies.resumed(time.time())
    resumed_unix = tallies.resumed_unix
    record.samples, record.steps = ckpt.meta["samples"], ckpt.meta["steps"]
    rec = {"kind": "full", "time_s": elapsed_s, "shard": shard,
           "ready_s": resumed_unix - tallies.start_unix, "job_sequence": ckpt.sequence,
           "samples_redone": redone, "lost_samples": 0, "lost_work_s": lost_s,
           "load_s": loaded["load_s"], "skipped": skipped,
           "standby": run.actors.directory is not None}
    record.recoveries.append(rec)
    # the workers train again when the shard serves its first pull after the rollback
    run.shard_watch.downtime_starts(shard, rec, killed, resumed_unix, None, tallies.start_unix,
                                    after_unix=rolled_back)
    run.rounds.failed(elapsed_s)
    record.event(elapsed_s, (
        f"full recovery: shard {shard} restarted; every shard, the data position and the "
        f"workers rolled back to job checkpoint {ckpt.sequence} ({ckpt.meta['samples']:,} "
        f"samples); ~{redone:,} samples ({lost_s:.1f} s of training at the rate before) "
        f"to do again, "
        f"{resumed_unix - killed:.1f} s without training")
        + (f"; skipped newer: {skipped}" if skipped else ""))
    print(f"full recovery: shard {shard} restarted; rolled back to job checkpoint "
          f"{ckpt.sequence} at {elapsed_s:.1f} s", flush=True)


def resume_from(run, ckpt: files.Checkpoint) -> None:
    """The driver resumed: go on from job checkpoint ``ckpt`` of an earlier run of this
    config."""
    record, actors = run.record, run.actors
    loaded = roll_back(run, ckpt)
    record.samples, record.steps = ckpt.meta["samples"], ckpt.meta["steps"]
    record.train_s_before = ckpt.meta["train_s"]
    moved = ""
    if loaded["resharded"] or loaded["workers_before"] != len(actors.workers):
        moved = (f" (written by {loaded['shards_before']} shard(s) and "
                 f"{loaded['workers_before']} worker(s); now {len(actors.shards)} and "
                 f"{len(actors.workers)})")
    text = (f"resumed from job checkpoint {ckpt.sequence} of {actors.checkpoint_dir}{moved}: "
            f"{record.samples:,} samples done, shards at versions {loaded['versions']}"
            + (f"; skipped newer: {ckpt.skipped}" if ckpt.skipped else ""))
    record.event(time.time() - run.tallies.start_unix, text)
    print(text, flush=True)


def roll_back(run, ckpt: files.Checkpoint) -> dict:
    """Full recovery and resume: every shard back to its checkpoint of job checkpoint
    ``ckpt``, the data position and the counts too, and fresh workers from its dense state.
    Returns the shards' versions and the slowest load (actors.roll_back)."""
    loaded = run.actors.roll_back(ckpt)
    workers = len(run.actors.workers)
    run.tallies.rolled_back(reshard.fold_counts(ckpt.meta["done"], workers))
    dense = job.dense_state(ckpt)
    if loaded["resharded"]:  # at once a job checkpoint of these shards: the newest is theirs
        run.rounds.log(run.rounds.take(resumed={
            "queue": loaded["queue"], "done": run.tallies.done_before, "dense": dense}),
            time.time() - run.tallies.start_unix, training=False)
    if run.elastic is not None:  # as many as can be placed, at least the minimum
        run.elastic.start(run, dense)
    else:
        run.start_workers(list(range(workers)), dense, ckpt.meta["step_index"])
    return loaded
