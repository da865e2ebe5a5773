"""Carrying out the policy's decisions (policy.py) on a DistributedRun, and logging them in the
run's record: workers replaced, a group rebuilt, replicas restarted, a shard's partial recovery
counted, everything rolled back to a job checkpoint (full recovery, or the driver resumed)."""

from __future__ import annotations

import time

from recsync.placement import node_alive, node_label
from recsync.checkpoint import files, job
from recsync.distributed.downtime import downtime_starts
from recsync.distributed.errors import RunFailed
from recsync.distributed.policy import Decision, Kind
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
            run.acknowledge(shards[i])
            log_partial_recovery(run, shards[i], elapsed_s)
        return
    if d.kind is Kind.ROLL_BACK:
        if resume is not None:
            resume_from(run, resume)
            return
        for i in d.shards:
            run.acknowledge(shards[i])
        for i in d.shards:
            full_recovery(run, i, elapsed_s)
        return
    run.restarts += len(d.dead)
    dead = list(d.dead)
    if d.kind is Kind.REPLACE_WORKERS:
        what = replace_workers(run, d, dead)
    elif d.kind is Kind.REBUILD_GROUP:
        what = rebuild_group(run, d, dead)
    elif d.kind is Kind.RESTART_FROM_REPLICA:
        what = restart_from_replica(run, d, dead)
    else:
        raise ValueError(f"no action for {d.kind}")
    run.record.event(time.time() - run.start_unix, what, dead=dead, restarted=list(d.ranks))


def replace_workers(run, d: Decision, dead: list[int]) -> str:
    """Fresh workers take the ranks; their leased chunks went back to the queue."""
    run.restart(list(d.ranks))
    if list(d.ranks) == dead:
        return f"worker(s) {dead} died; restarted, their chunks requeued"
    why = " (switching is on)" if run.cfg.switching.enabled else ""
    return (f"worker(s) {dead} died; every worker restarted on a new group{why}, chunks "
            f"requeued")


def rebuild_group(run, d: Decision, dead: list[int]) -> str:
    """A live replica's dense state as of its current step and the one before; then no worker
    is left to push, the PS forgets the incomplete step, and the step it completed decides
    which state the new group starts from."""
    states = run.recovery_states(d.source)
    run.retire(list(d.ranks))
    run.shard_call("drop_incomplete")
    # A worker that dies between its pushes to the shards leaves its last step complete on
    # some shards only. The group goes on after that step (the dense replicas took it); the
    # shards that missed it skip it, losing that step's row update.
    versions = run.shard_versions()
    step = max(versions)
    if step not in states:
        raise RunFailed(f"cannot rebuild the {run.mode} group: the PS completed step {step}, "
                        f"worker {d.source}'s replica knows steps {sorted(states)}")
    lagging = [i for i, v in enumerate(versions) if v < step]
    run.advance_shards(step, lagging)
    run.start_workers(list(d.ranks), states[step], step)
    return (f"worker(s) {dead} died; {run.mode} group rebuilt at step {step} from worker "
            f"{d.source}'s replica, chunks requeued"
            + (f"; shard(s) {lagging} had not completed step {step - 1} and skip its row "
               f"update" if lagging else ""))


def restart_from_replica(run, d: Decision, dead: list[int]) -> str:
    """The dense replicas restart from a live one's parameters (their optimizer state starts
    afresh)."""
    params = run.dense_state(d.source, timeout=30)["params"]
    ranks = list(d.ranks)
    run.restart(ranks, {"params": params, "optimizer": None})
    return (f"worker(s) {dead} died; worker(s) {ranks} restarted from worker {d.source}'s "
            f"dense replica (dense optimizer state reset), chunks requeued")


def log_partial_recovery(run, s: ShardStatus, elapsed_s: float) -> None:
    """A shard came back from its own last checkpoint: the updates it had applied since (from
    the checkpoint's version to the last version the driver saw, at most half a second before
    it died) are lost, each one update's samples: counted for PLS."""
    record, cfg, restored = run.record, run.cfg, s.restored
    per_update = MODES[cfg.mode].samples_per_update(cfg)
    lost_updates = max(0, s.version_before - restored["version"])
    lost = lost_updates * per_update
    killed = run.killed_at.pop(s.index, s.ready_unix)
    rec = {"kind": "partial", "time_s": elapsed_s, "shard": s.index,
           "ready_s": s.ready_unix - run.start_unix, "lost_updates": lost_updates,
           "lost_samples": lost, "version_before": s.version_before, "lost_work_s": 0.0,
           "standby": run.directory is not None, **restored,
           "node_before": s.node_before, "node": s.node,
           "node_before_alive": node_alive((s.node_before or {}).get("node_id"))}
    record.recoveries.append(rec)
    downtime_starts(run, s.index, rec, killed, s.ready_unix, s.first_pull_unix)
    run.rounds.failed(elapsed_s)
    what = (f"checkpoint {restored['sequence']} (version {restored['version']})"
            if restored["sequence"] is not None else "nothing (no checkpoint yet: from scratch)")
    record.event(elapsed_s, (
        f"partial recovery: shard {s.index}{_on(s.node_before, rec['node_before_alive'])} "
        f"restarted{_on(s.node)} from {what}; its {lost_updates:,} updates since "
        f"(~{lost:,} samples) are lost")
        + (f"; skipped: {restored['skipped']}" if restored["skipped"] else ""))
    print(f"partial recovery: shard {s.index} restarted from {what} at {elapsed_s:.1f} s",
          flush=True)


def _on(node: dict | None, alive: bool | None = None) -> str:
    """" on node 10.0.0.2 (1a2b3c4d)", with ", down" where the cluster lists it dead."""
    return f" on node {node_label(node, down=alive is False)}" if node else ""


def full_recovery(run, shard: int, elapsed_s: float) -> None:
    """A shard came back (Ray restarted it): roll every shard, the data position and the
    workers back to the newest job checkpoint that loads whole. The work since (from the later
    of that checkpoint and the previous rollback to the failure) is done again."""
    record = run.record
    run.rounds.flush()
    ckpt, skipped = job.restorable(run.checkpoint_dir)
    if ckpt is None:
        raise RunFailed(f"full recovery after shard {shard} died: no complete job checkpoint in "
                        f"{run.checkpoint_dir}" + (f" ({'; '.join(skipped)})" if skipped else ""))
    now = time.time()
    killed = run.killed_at.pop(shard, now)
    redone = max(0, record.samples - ckpt.meta["samples"])
    # the work done again, priced at the training rate before the failure (the samples of a
    # chunk that was leased at the checkpoint are redone too: more than the time since it)
    before = [(t, n) for t, n in run.recent if t <= killed]
    rate = ((before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
            if len(before) >= 2 and before[-1][0] > before[0][0] else 0.0)
    lost_work_s = (redone / rate if rate > 0
                   else max(0.0, killed - max(ckpt.meta["unix"], run.resumed_unix)))
    rolled_back = time.time()
    loaded = run.rollback(ckpt)
    run.resumed_unix = time.time()
    run.recent.clear()
    record.samples, record.steps = ckpt.meta["samples"], ckpt.meta["steps"]
    rec = {"kind": "full", "time_s": elapsed_s, "shard": shard,
           "ready_s": run.resumed_unix - run.start_unix, "job_sequence": ckpt.sequence,
           "samples_redone": redone, "lost_samples": 0, "lost_work_s": lost_work_s,
           "load_s": loaded["load_s"], "skipped": skipped,
           "standby": run.directory is not None}
    record.recoveries.append(rec)
    # the workers train again when the shard serves its first pull after the rollback
    downtime_starts(run, shard, rec, killed, run.resumed_unix, None, after_unix=rolled_back)
    run.rounds.failed(elapsed_s)
    record.event(elapsed_s, (
        f"full recovery: shard {shard} restarted; every shard, the data position and the "
        f"workers rolled back to job checkpoint {ckpt.sequence} ({ckpt.meta['samples']:,} "
        f"samples); ~{redone:,} samples ({lost_work_s:.1f} s of training at the rate before) "
        f"to do again, "
        f"{run.resumed_unix - killed:.1f} s without training")
        + (f"; skipped newer: {skipped}" if skipped else ""))
    print(f"full recovery: shard {shard} restarted; rolled back to job checkpoint "
          f"{ckpt.sequence} at {elapsed_s:.1f} s", flush=True)


def resume_from(run, ckpt: files.Checkpoint) -> None:
    """The driver resumed: go on from job checkpoint ``ckpt`` of an earlier run of this
    config."""
    record = run.record
    loaded = run.rollback(ckpt)
    record.samples, record.steps = ckpt.meta["samples"], ckpt.meta["steps"]
    record.train_s_before = ckpt.meta["train_s"]
    moved = ""
    if loaded["resharded"] or loaded["workers_before"] != len(run.workers):
        moved = (f" (written by {loaded['shards_before']} shard(s) and "
                 f"{loaded['workers_before']} worker(s); now {len(run.shards)} and "
                 f"{len(run.workers)})")
    text = (f"resumed from job checkpoint {ckpt.sequence} of {run.checkpoint_dir}{moved}: "
            f"{record.samples:,} samples done, shards at versions {loaded['versions']}"
            + (f"; skipped newer: {ckpt.skipped}" if ckpt.skipped else ""))
    record.event(time.time() - run.start_unix, text)
    print(text, flush=True)
