"""``DistributedRun``: the actors of one distributed run (PS shards, a work queue, workers) and
the few verbs the driver uses on them: start workers, poll them and the shards (typed
statuses), pause and resume all, retire and restart workers, roll back to a job checkpoint,
kill (fault injection). What to do when, and why, is decided elsewhere (watch, policy,
actions, checkpoints, switching, ending: the end of the run)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from pathlib import Path

import numpy as np
import ray
import torch
from torch.nn.utils import parameters_to_vector

from recsync.checkpoint import files, job, reshard
from recsync.config import RunConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.distributed.checkpoints import CheckpointRounds
from recsync.distributed.errors import RunFailed
from recsync.distributed.faults import death_cause
from recsync.distributed.spawn import spawn_workers
from recsync.distributed.policy import recovery_kind
from recsync.distributed.downtime import downtime_ends
from recsync import storage, warm_start
from recsync.distributed.status import (ALIVE, DEAD, RESTARTING, ShardStatus, WorkerStatus,
                                        counts_of_dead, node_of)
from recsync.local_run import CHUNK_BATCHES
from recsync.model.setup import model_for
from recsync.modes import MODES
from recsync.placement import on_driver_node
from recsync.ps.standby import start_shards
from recsync.record import RunRecord
from recsync.worker.queue import WorkQueue

PAUSE_TIMEOUT_S = 120  # a worker pauses after its current step: minutes mean it is stuck
SHARD_RESTART_WAIT_S = 60  # recovery: how long a restarting shard may take to answer
RATE_WINDOW_POLLS = 20  # the training rate that prices work done again: over the last 10 s
ACTOR_GONE = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)


class DistributedRun:
    """The actors of one run, what the driver knows of them, and the run's record."""

    def __init__(self, cfg: RunConfig, ds: Dataset, checkpoint_root: Path | None = None,
                 started: float | None = None, warm=None):
        """``checkpoint_root``: where the shards' checkpoints go if ``recovery`` asks for them
        (``recovery.dir`` wins); ``started``: when the run began (perf_counter; default now);
        ``warm``: the model directory the run starts from (warm_start.py), if any."""
        self.cfg, self.ds = cfg, ds
        self.record = RunRecord() if started is None else RunRecord(start=started)
        c, t = cfg.cluster, cfg.train
        torch.manual_seed(t.seed)
        built = model_for(cfg.model, ds)
        self.dense_model, self.tables, self.plan = built.module, built.tables, built.plan
        self.warm = warm
        if warm is not None:  # shard 0 (and EASGD's center) start from its dense parameters
            self.dense_model.load_state_dict(warm.dense_state)
        dense_init = self.initial_dense()
        self.checkpoint_dir = None
        if cfg.recovery.checkpoint_every_s or cfg.recovery.mtbf_s:
            root = storage.local(cfg.recovery.dir) if cfg.recovery.dir else checkpoint_root
            if root is None:
                raise ValueError("recovery.checkpoint_every_s is set but there is no directory "
                                 "for checkpoints: set recovery.dir")
            self.checkpoint_dir = root.resolve()
        # a dead shard's place: a standby's (``directory``: which process serves which
        # shard), or its own process, restarted by Ray
        self.shards, self._builders, self.directory, self.placement = start_shards(
            cfg, self.tables, dense_init, self.checkpoint_dir)
        chunks = ds.chunks("train", cfg.data.chunk_rows or CHUNK_BATCHES * t.batch_size)
        seed = t.seed if cfg.data.shuffle else None
        items = [(e, ch) for e in range(t.epochs)
                 for ch in chunk_order(chunks, epoch=e, shuffle_seed=seed)]
        self.queue = WorkQueue.options(**on_driver_node()).remote(items)  # outlives any node
        self.workers: list = [None] * c.workers
        self.done_before = [{"samples": 0, "steps": 0} for _ in range(c.workers)]  # dead ones'
        self.last = [{"samples": 0, "steps": 0} for _ in range(c.workers)]
        self.taken: list[list] = [[] for _ in range(c.workers)]
        self.restarts = 0  # workers restarted after a death
        self.start_unix = 0.0  # epoch seconds when training starts: fault schedules count from it
        self.clock_started = False  # set when the first workers start training
        self.mode = cfg.mode  # the mode now (switching changes it)
        self.recovery = recovery_kind(cfg)  # the recovery in force ("auto": chosen later)
        self.shard_seen: dict[int, dict] = {}  # each shard's incarnation the driver last saw
        self.killed_at: dict[int, float] = {}  # shard -> epoch seconds of its failure (until
        # it is recovered): an injected kill's time, else the driver's last answer from it
        self.shard_answered: dict[int, float] = {}  # shard -> epoch s of its last answer
        self.downtime_open: dict[int, tuple] = {}  # shard -> its recovery, until a pull served
        self.killed_workers: set[int] = set()  # ranks killed by injection, not yet restarted
        self.resumed_unix = 0.0  # when the last rollback had workers going again
        self.recent: deque = deque(maxlen=RATE_WINDOW_POLLS)  # (epoch s, samples) per poll
        self.rounds = CheckpointRounds(self)

    @property
    def facts(self):
        """The mode now's facts (recsync.modes.base.Mode)."""
        return MODES[self.mode]

    def initial_dense(self) -> np.ndarray:
        return parameters_to_vector(self.dense_model.parameters()).detach().numpy().copy()

    def start_dense(self) -> dict | None:
        """The dense state the first workers start from where they hold it: a warm start's
        parameters and optimizer state (flat layout); None: the model's initial values."""
        if self.warm is None or self.facts.dense_on_ps:
            return None
        return {"params": self.initial_dense(), "optimizer": warm_start.flat_optimizer_state(
            self.warm, self.cfg, len(self.initial_dense()))}

    # -- workers -------------------------------------------------------------------------
    def start_workers(self, ranks: list[int], dense_state: dict | None = None,
                      step_index: int = 0) -> None:
        """Fresh workers for ``ranks`` (``dense_state``: flat layout, as ``dense_state()``
        gives it), on a new group where the mode has one; then they start training."""
        spawn_workers(self, ranks, dense_state, step_index)
        self.killed_workers -= set(ranks)
        if self.facts.needs_group(self.cfg):
            host, port = ray.get(self.workers[0].address.remote())
            ray.get([w.join_group.remote(host, port, len(self.workers)) for w in self.workers])
        if not self.clock_started:  # training starts now: start-up is not training time
            self.clock_started = True
            self.start_unix = time.time() - self.record.train_s_before
            self.record.train_start = time.perf_counter()
        ray.get([self.workers[r].start.remote(self.start_unix) for r in ranks])

    def poll(self) -> list[WorkerStatus]:
        """Every worker's status, its counts including its rank's earlier processes'; a dead
        worker reads as state "dead"."""
        refs = [w.status.remote() for w in self.workers]
        out = []
        for r, ref in enumerate(refs):
            try:
                s = WorkerStatus.from_dict(ray.get(ref, timeout=30))
            except ACTOR_GONE:
                s = WorkerStatus(rank=r, state=DEAD, **self.dead_counts(r))
            self.last[r] = {"samples": s.samples, "steps": s.steps}
            out.append(replace(s, samples=s.samples + self.done_before[r]["samples"],
                               steps=s.steps + self.done_before[r]["steps"]))
        return out

    def retire(self, ranks: list[int]) -> None:
        """Count each worker's work as done by its rank, forget the process, and put its
        leased chunks back in the queue."""
        for r in ranks:
            try:
                self.taken[r] += ray.get(self.workers[r].taken_chunks.remote(), timeout=5)
                s = ray.get(self.workers[r].status.remote(), timeout=5)
                self.last[r] = {k: s[k] for k in ("samples", "steps")}
            except ACTOR_GONE:
                self.last[r] = self.dead_counts(r)
            self.done_before[r] = {k: self.done_before[r][k] + self.last[r][k] for k in
                                   ("samples", "steps")}
            self.last[r] = {"samples": 0, "steps": 0}
            ray.kill(self.workers[r], no_restart=True)
            ray.get(self.queue.release.remote(r))

    def dead_counts(self, r: int) -> dict:
        """Rank ``r``'s dead process's counts, corrected by the queue (status.counts_of_dead)."""
        done = ray.get(self.queue.summary.remote())["by_worker"].get(str(r), {"samples": 0})
        return counts_of_dead(self.last[r], self.done_before[r], done["samples"],
                              self.cfg.train.batch_size)

    def restart(self, ranks: list[int], dense_state: dict | None = None,
                step_index: int = 0) -> None:
        self.retire(ranks)
        self.start_workers(ranks, dense_state, step_index)

    def dense_state(self, rank: int = 0, timeout: float | None = 60) -> dict | None:
        """Worker ``rank``'s dense parameters and optimizer state (flat layout), or None where
        the PS holds them."""
        return ray.get(self.workers[rank].dense_state.remote(), timeout=timeout)

    def recovery_states(self, rank: int) -> dict[int, dict]:
        """Worker ``rank``'s dense states by step (modes that rebuild their group)."""
        return ray.get(self.workers[rank].recovery_states.remote(), timeout=30)

    def pause_all(self, why: str) -> bool:
        """Ask every worker to pause after a step and wait until all have. Returns False (and
        lets them go on) if a worker finished or failed meanwhile (the run is ending, or
        recovery comes first), or a shard changed (workers waiting for it cannot pause)."""
        ray.get([w.request_pause.remote() for w in self.workers])
        states: list[str] = []
        deadline = time.time() + PAUSE_TIMEOUT_S
        while True:
            if time.time() > deadline:
                raise RunFailed(f"{why}: the workers did not all pause within "
                                f"{PAUSE_TIMEOUT_S} s (states: {states})")
            states = [s["state"] for s in ray.get([w.status.remote() for w in self.workers],
                                                   timeout=60)]
            if ("error" in states or "done" in states
                    or (self.cfg.recovery.kind != "none" and self._shard_changed())):
                self.resume_all()
                return False
            if all(s == "paused" for s in states):
                return True
            time.sleep(0.05)

    def resume_all(self, mode: str | None = None, dense_state: dict | None = None,
                   step_index: int = 0) -> None:
        """Paused workers go on, in ``mode`` (default: the mode now)."""
        ray.get([w.resume.remote(mode or self.mode, dense_state, step_index)
                 for w in self.workers])

    # -- shards --------------------------------------------------------------------------
    def shard_statuses(self, patience_s: float | None = None) -> list[ShardStatus]:
        """Every shard's status. Without ``patience_s`` (every poll, recovery on): one look;
        a shard that does not answer reads as restarting. With it: a shard that does not
        answer (5 s a try) for ``patience_s`` reads as dead, with the cause. A shard that
        Ray restarted reads as ``restarted`` until ``acknowledge`` d."""
        out = []
        if patience_s is None:
            for i, ref in enumerate([s.incarnation.remote() for s in self.shards]):
                try:
                    out.append(self._seen(i, self._answer(i, ref, 30)))
                except ACTOR_GONE as e:
                    out.append(ShardStatus(i, RESTARTING, cause=death_cause(e)))
            return out
        for i in range(len(self.shards)):
            deadline = time.monotonic() + patience_s
            while True:
                try:
                    out.append(self._seen(i, self._answer(
                        i, self.shards[i].incarnation.remote(), 5)))
                    break
                except ACTOR_GONE as e:
                    if time.monotonic() >= deadline:
                        out.append(ShardStatus(i, DEAD, cause=death_cause(e)))
                        break
                    time.sleep(0.5)
        return out

    def _answer(self, i: int, ref, timeout: float) -> dict:
        """Shard ``i``'s answer ``ref``; if it died and a standby takes its place, the
        standby's (asked again: ``self.shards`` then holds the standby, for every caller)."""
        try:
            return ray.get(ref, timeout=timeout)
        except ACTOR_GONE:
            if self.directory is None:
                raise
            self.shards[i] = ray.get(self.directory.current.remote(i), timeout=timeout + 60)
            return ray.get(self.shards[i].incarnation.remote(), timeout=timeout)

    def _seen(self, i: int, inc: dict) -> ShardStatus:
        before = self.shard_seen.get(i)
        restarted = before is not None and before["pid"] != inc["pid"]
        if restarted:  # unless a kill was injected, the old process failed after its last
            # answer (at most a poll, 0.5 s, before it): its downtime counts from then
            self.killed_at.setdefault(i, self.shard_answered.get(i, time.time()))
        else:
            self.shard_seen[i] = inc
            self.shard_answered[i] = time.time()
            downtime_ends(self, i, inc["first_pull_unix"])
        return ShardStatus(i, ALIVE, pid=inc["pid"], version=inc["version"],
                           ready_unix=inc["ready_unix"], restored=inc["restored"],
                           restarted=restarted, first_pull_unix=inc["first_pull_unix"],
                           version_before=None if before is None else before["version"],
                           node=node_of(inc), node_before=node_of(before))

    def acknowledge(self, s: ShardStatus) -> None:
        """The restart of shard ``s`` is dealt with: its new process is the one seen."""
        self.shard_seen[s.index] = {"pid": s.pid, "version": s.version,
                                    "ready_unix": s.ready_unix, "restored": s.restored,
                                    **(s.node or {})}

    def _shard_changed(self) -> bool:
        """Whether a shard is dead or restarting, or restarted since the driver last looked."""
        refs = [s.incarnation.remote() for s in self.shards]
        try:
            pids = [inc["pid"] for inc in ray.get(refs, timeout=1.0)]
        except ACTOR_GONE:
            return True
        return any(i in self.shard_seen and pid != self.shard_seen[i]["pid"]
                   for i, pid in enumerate(pids))

    def shard_call(self, verb: str, *args) -> list:
        """A verb of the shards' mode rule (``end``, ``drop_incomplete``, ...) on every shard."""
        return ray.get([s.call.remote(verb, *args) for s in self.shards])

    def shard_versions(self) -> list[int]:
        return [st["version"] for st in ray.get([s.stats.remote() for s in self.shards])]

    def advance_shards(self, step: int, which: list[int] | None = None) -> None:
        """Shards (``which``, default all) go on at version ``step``."""
        which = range(len(self.shards)) if which is None else which
        ray.get([self.shards[i].advance_to.remote(step) for i in which])

    # -- roll back, kill ---------------------------------------------------------------------
    def rollback(self, ckpt: files.Checkpoint) -> dict:
        """Full recovery and resume: every shard back to its checkpoint of job checkpoint
        ``ckpt``, the data position and the counts too, and fresh workers from its dense
        state. Returns the shards' versions and the slowest load."""
        for w in self.workers:
            if w is not None:
                ray.kill(w, no_restart=True)
        meta = ckpt.meta
        sequences = meta["shard_sequences"]
        resharded = len(sequences) != len(self.shards)
        if resharded:  # resume onto another number of shards: each reads every old one's
            sources = [(str(job.shard_dir(self.checkpoint_dir, k)), seq)
                       for k, seq in enumerate(sequences)]
            loaded = ray.get([s.reshard.remote(sources) for s in self.shards], timeout=900)
        else:
            loaded = ray.get([s.rollback.remote(seq) for s, seq in
                              zip(self.shards, sequences)], timeout=300)
        workers = len(self.workers)
        queue = reshard.fold_queue(meta["queue"], workers)
        ray.get(self.queue.restore.remote(queue))
        self.done_before = reshard.fold_counts(meta["done"], workers)
        self.last = [{"samples": 0, "steps": 0} for _ in self.workers]
        self.workers = [None] * workers
        dense = job.dense_state(ckpt)
        if resharded:  # at once a job checkpoint of these shards: the newest is theirs
            self.rounds.log(self.rounds.take(resumed={
                "queue": queue, "done": self.done_before, "dense": dense}),
                time.time() - self.start_unix, training=False)
        self.start_workers(list(range(workers)), dense, meta["step_index"])
        return {"versions": [x["version"] for x in loaded],
                "load_s": max(x["load_s"] for x in loaded), "resharded": resharded,
                "shards_before": len(sequences), "workers_before": len(meta["done"])}

    def kill(self, target: str, index: int) -> None:
        """Fault injection: the worker, PS shard or waiting standby ``index`` exits at once."""
        if target == "standby":
            ray.get(self.directory.standby_handles.remote())[index].die.remote()
            return
        if target == "worker":
            self.killed_workers.add(index)
        else:
            self.killed_at[index] = time.time()
        (self.workers if target == "worker" else self.shards)[index].die.remote()

    def kill_in_next_write(self, index: int) -> None:
        """Fault injection: PS shard ``index`` exits in the middle of its next checkpoint write
        (its death is then seen as any failure from outside is: downtime from its last answer)."""
        self.shards[index].die_in_next_write.remote()

    def is_down(self, target: str, index: int) -> bool:
        """Whether the worker or PS shard ``index`` was killed and is not back yet (a shard:
        not yet recovered; a worker: not yet restarted; a standby's place is refilled)."""
        if target == "standby":
            return False
        return index in (self.killed_workers if target == "worker" else self.killed_at)
