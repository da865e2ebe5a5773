"""``RunActors``: the actors of one distributed run (PS shards, a work queue, workers) and the
few verbs the driver uses on them: start workers, poll them and the shards (typed statuses),
pause and resume all, retire workers, roll the shards back to a job checkpoint, kill (fault
injection). The one part of the run handle that speaks to Ray (with spawn.py); what it hears
goes to the Ray-free parts passed in (tallies.py, shard_watch.py). What to do when, and why,
is decided elsewhere (watch, policy, actions, checkpoints, switching, ending)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path

import ray

from recsync.checkpoint import files, job, reshard
from recsync.cluster.placement import on_driver_node
from recsync.config import RunConfig
from recsync.distributed.errors import RunFailed
from recsync.distributed.faults import death_cause
from recsync.distributed.spawn import form_group, new_worker, spawn_workers
from recsync.distributed.status import DEAD, PENDING, RESTARTING, VACANT, ShardStatus, WorkerStatus
from recsync.modes import MODES
from recsync.ps.standby import start_shards
from recsync.worker.queue import WorkQueue, in_rows

PAUSE_TIMEOUT_S = 120  # a worker pauses after its current step: minutes mean it is stuck
SHARD_RESTART_WAIT_S = 60  # recovery: how long a restarting shard may take to answer
STOP_WAIT_S = 10  # a failed run's actors, killed: how long their deaths are waited for
ACTOR_GONE = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)


class RunActors:
    """The actors of one run (``items``: the (epoch, chunk) the queue hands out;
    ``checkpoint_dir``: where the shards' checkpoints go, if any), and the mode they run in
    now (``use_mode`` changes it)."""

    def __init__(self, cfg: RunConfig, items: list[tuple], tables, dense_init,
                 checkpoint_dir: Path | None):
        self.cfg, self.mode, self.checkpoint_dir = cfg, cfg.mode, checkpoint_dir
        # a dead shard's place: a standby's (``directory``: which process serves which
        # shard), or its own process, restarted by Ray
        self.shards, self._builders, self.directory, self.placement = start_shards(
            cfg, tables, dense_init, checkpoint_dir)
        self.queue = WorkQueue.options(**on_driver_node()).remote(items)  # outlives any node
        self.workers: list = [None] * cfg.cluster.workers  # None: no process (elastic runs)
        self.pending: dict[int, ray.ObjectRef] = {}  # elastic: rank -> its worker's ``where``,
        # answered once Ray placed and built it
        self.waiting: dict[int, dict] = {}  # elastic sync: rank -> where its worker was built,
        # until the group is formed again with it (regroup.py)
        self.gone: list[dict] = []  # figures of workers that left an elastic run (ending.py)

    @property
    def facts(self):
        """The mode now's facts (recsync.modes.base.Mode)."""
        return MODES[self.mode]

    def spawn(self, ranks: list[int], dense_state: dict | None = None,
              step_index: int = 0) -> None:
        """Fresh workers for ``ranks`` (``dense_state``: flat layout, as ``dense_state()``
        gives it), on a new group where the mode has one; ``start`` has them train."""
        spawn_workers(self, ranks, dense_state, step_index)
        if self.facts.needs_group(self.cfg):
            form_group(self, sorted(ranks))

    def live(self) -> list[int]:
        """The ranks whose worker was started and not retired since (a run of a fixed size:
        every rank)."""
        return [r for r, w in enumerate(self.workers)
                if w is not None and r not in self.pending and r not in self.waiting]

    def spawn_later(self, ranks: list[int]) -> None:
        """Elastic runs: fresh workers for ``ranks``, not waited for: Ray builds each where and
        when it can place it (``placed`` says which are built)."""
        for r in ranks:
            self.workers[r] = new_worker(self, r, None, 0)
            self.pending[r] = self.workers[r].where.remote()

    def placed(self) -> dict[int, dict]:
        """{rank: its node and pid} of the pending workers built since the last call (the caller
        starts them). One that died unbuilt (its node died) is asked for again; one whose
        constructor raised raises: that error would recur."""
        if not self.pending:
            return {}
        refs = list(self.pending.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out = {}
        for r, ref in list(self.pending.items()):
            if ref not in ready:
                continue
            try:
                out[r] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                if e.actor_init_failed:
                    raise
                self.spawn_later([r])
                continue
            del self.pending[r]
        return out

    def cancel(self, ranks: list[int]) -> None:
        """Pending workers ``ranks`` are not wanted any more."""
        for r in ranks:
            ray.kill(self.workers[r], no_restart=True)
            self.workers[r] = None
            self.pending.pop(r, None)
            self.waiting.pop(r, None)

    def leave(self, ranks: list[int]) -> None:
        """Workers ``ranks`` finish the chunks they hold and leave (Worker.leave)."""
        for r in ranks:
            with contextlib.suppress(*ACTOR_GONE):
                ray.get(self.workers[r].leave.remote(), timeout=30)

    def chunks_left(self) -> int:
        """Chunks of the queue pending or leased."""
        q = ray.get(self.queue.summary.remote(), timeout=60)
        return q["pending"] + q["leased"]

    def avoid_nodes(self, node_ids: set[str]) -> None:
        """Workers asked for from now on go to other nodes than ``node_ids`` (drained)."""
        self.placement.avoid = set(node_ids)

    def free_resources(self) -> str:
        """What the cluster has free now, for a message."""
        return f"free now: {ray.available_resources()}"

    def nodes(self) -> dict[int, str]:
        """{rank: node id} of the live workers that answer."""
        refs = {r: self.workers[r].where.remote() for r in self.live()}
        out = {}
        for r, ref in refs.items():
            with contextlib.suppress(*ACTOR_GONE):
                out[r] = ray.get(ref, timeout=30)["node_id"]
        return out

    def shard_nodes(self) -> dict[int, str]:
        """{shard: node id} of the shards' processes now."""
        nodes = ray.get([s.where.remote() for s in self.shards], timeout=30)
        return {i: n["node_id"] for i, n in enumerate(nodes)}

    def standby_nodes(self) -> list[str]:
        """The node of each waiting standby, the next to take over first."""
        if self.directory is None:
            return []
        standbys = ray.get(self.directory.standby_handles.remote(), timeout=30)
        return [n["node_id"] for n in ray.get([s.where.remote() for s in standbys], timeout=60)]

    def wait_written(self, shard: int, sequence: int, timeout_s: float) -> None:
        """Until shard ``shard``'s checkpoint ``sequence`` is on disk (RunFailed after
        ``timeout_s``)."""
        deadline = time.time() + timeout_s
        while sequence not in [w["sequence"] for w in ray.get(
                self.shards[shard].checkpoints_written.remote(), timeout=timeout_s)]:
            if time.time() > deadline:
                raise RunFailed(f"shard {shard}'s checkpoint {sequence} was not written in "
                                f"{timeout_s:g} s")
            time.sleep(0.05)

    def stop_shard(self, index: int) -> None:
        """PS shard ``index``'s process ends (a planned move: a standby takes it over) and is
        waited for, so that its take-over starts now."""
        shard = self.shards[index]
        ray.kill(shard, no_restart=True)
        ray.wait([shard.__ray_ready__.remote()], timeout=STOP_WAIT_S)

    def measure_idle(self) -> None:
        """The emulated cluster: each shard measures its idle CPU while the workers, as they
        start, measure theirs (cluster/emulation.py); not waited for."""
        if self.cfg.emulation.cores_per_shard > 0:
            self._idle_refs = [s.measure_idle.remote() for s in self.shards]

    def start(self, ranks: list[int], start_unix: float, dense_state: dict | None = None,
              step_index: int = 0) -> None:
        """Workers ``ranks`` start training (``start_unix``: when the run's training began;
        ``dense_state``: a live replica's, for workers built before it, at ``step_index``)."""
        ray.get([self.workers[r].start.remote(start_unix, dense_state, step_index)
                 for r in ranks])

    def poll(self, tallies) -> list[WorkerStatus]:
        """Every worker's status, its counts including its rank's earlier processes'
        (``tallies``: tallies.RunTallies, which keeps them); a dead worker reads as "dead", a
        rank without a process as "vacant", one whose process is not built yet as "pending"."""
        live = set(self.live())
        refs = [w.status.remote() if r in live else None for r, w in enumerate(self.workers)]
        out = []
        for r, ref in enumerate(refs):
            if ref is None:  # a built worker waiting for its group is pending too
                state = PENDING if r in self.pending or r in self.waiting else VACANT
                out.append(WorkerStatus(rank=r, state=state, **tallies.polled(r, 0, 0)))
                continue
            try:
                s = WorkerStatus.from_dict(ray.get(ref, timeout=30))
            except ACTOR_GONE:
                s = WorkerStatus(rank=r, state=DEAD, **self._dead_counts(r, tallies))
            out.append(replace(s, **tallies.polled(r, s.samples, s.steps)))
        return out

    def retire(self, ranks: list[int], tallies) -> None:
        """Count each worker's work as done by its rank (in ``tallies``), forget the process,
        and put its leased chunks back in the queue."""
        for r in ranks:
            try:
                tallies.took(r, ray.get(self.workers[r].taken_chunks.remote(), timeout=5))
                s = ray.get(self.workers[r].status.remote(), timeout=5)
                last = {k: s[k] for k in ("samples", "steps")}
            except ACTOR_GONE:
                last = self._dead_counts(r, tallies)
            tallies.retired(r, last)
            if self.cfg.cluster.elastic:  # its figures outlive it (ending.py)
                with contextlib.suppress(*ACTOR_GONE):
                    w = self.workers[r]
                    stats, pacing = ray.get([w.mode_stats.remote(), w.pacing.remote()],
                                            timeout=5)
                    self.gone.append({"rank": r, "mode_stats": stats, "pacing": pacing})
            ray.kill(self.workers[r], no_restart=True)
            ray.get(self.queue.release.remote(r))

    def _dead_counts(self, r: int, tallies) -> dict:
        """Rank ``r``'s dead process's counts, corrected by the queue (status.counts_of_dead)."""
        done = ray.get(self.queue.summary.remote())["by_worker"].get(str(r), {"samples": 0})
        return tallies.dead_counts(r, done["samples"], self.cfg.train.batch_size)

    def dense_state(self, rank: int = 0, timeout: float | None = 60) -> dict | None:
        """Worker ``rank``'s dense parameters and optimizer state (flat layout), or None where
        the PS holds them."""
        return ray.get(self.workers[rank].dense_state.remote(), timeout=timeout)

    def recovery_states(self, rank: int) -> dict[int, dict]:
        """Worker ``rank``'s dense states by step (modes that rebuild their group)."""
        return ray.get(self.workers[rank].recovery_states.remote(), timeout=30)

    def pause_all(self, why: str, watch) -> bool:
        """Ask every worker to pause after a step and wait until all have. Returns False (and
        lets them go on) if a worker finished or failed meanwhile (the run is ending, or
        recovery comes first), or a shard changed since ``watch`` (shard_watch.ShardWatch)
        saw it (workers waiting for it cannot pause)."""
        workers = [self.workers[r] for r in self.live()]
        ray.get([w.request_pause.remote() for w in workers])
        states: list[str] = []
        deadline = time.time() + PAUSE_TIMEOUT_S
        while True:
            if time.time() > deadline:
                raise RunFailed(f"{why}: the workers did not all pause within "
                                f"{PAUSE_TIMEOUT_S} s (states: {states})")
            states = [s["state"] for s in ray.get([w.status.remote() for w in workers],
                                                   timeout=60)]
            if ("error" in states or "done" in states or "left" in states
                    or (self.cfg.recovery.kind != "none" and self._shard_changed(watch))):
                self.resume_all()
                return False
            if all(s == "paused" for s in states):
                return True
            time.sleep(0.05)

    def resume_all(self, mode: str | None = None, dense_state: dict | None = None,
                   step_index: int = 0) -> None:
        """Paused workers go on, in ``mode`` (default: the mode now)."""
        ray.get([self.workers[r].resume.remote(mode or self.mode, dense_state, step_index)
                 for r in self.live()])

    def hand_over(self, ranks: list[int]) -> None:
        """Paused workers ``ranks`` give their leased chunks back with the rows they trained
        (queue.hand_over), before they are retired."""
        for r in ranks:
            rows = {slot: n for (_, slot), n in ray.get(
                self.workers[r].positions.remote(), timeout=30).items()}
            ray.get(self.queue.hand_over.remote(r, rows))

    def shard_statuses(self, watch, patience_s: float | None = None) -> list[ShardStatus]:
        """Every shard's status, as ``watch`` (shard_watch.ShardWatch) sees its answer.
        Without ``patience_s`` (every poll, recovery on): one look; a shard that does not
        answer reads as restarting. With it: a shard that does not answer (5 s a try) for
        ``patience_s`` reads as dead, with the cause. A shard that Ray restarted reads as
        ``restarted`` until ``watch.acknowledge`` d."""
        out = []
        if patience_s is None:
            for i, ref in enumerate([s.incarnation.remote() for s in self.shards]):
                try:
                    out.append(watch.seen(i, self._answer(i, ref, 30)))
                except ACTOR_GONE as e:
                    out.append(ShardStatus(i, RESTARTING, cause=death_cause(e)))
            return out
        for i in range(len(self.shards)):
            deadline = time.monotonic() + patience_s
            while True:
                try:
                    out.append(watch.seen(i, self._answer(
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

    def _shard_changed(self, watch) -> bool:
        """Whether a shard is dead or restarting, or restarted since ``watch`` last saw it."""
        refs = [s.incarnation.remote() for s in self.shards]
        try:
            pids = [inc["pid"] for inc in ray.get(refs, timeout=1.0)]
        except ACTOR_GONE:
            return True
        return any(watch.moved(i, pid) for i, pid in enumerate(pids))

    def take_over(self, which: list[int]) -> None:
        """Shards ``which`` were stopped on purpose: wait until a standby holds each, and point
        every live worker at the new processes before it calls them again (a call to the old
        one, a push above all, would be lost)."""
        for i in which:
            self.shards[i] = ray.get(self.directory.current.remote(i),
                                     timeout=SHARD_RESTART_WAIT_S + 60)
        moved = {i: self.shards[i] for i in which}
        ray.get([self.workers[r].use_shards.remote(moved) for r in self.live()], timeout=60)

    def shard_call(self, verb: str, *args) -> list:
        """A verb of the shards' mode rule (``end``, ``drop_incomplete``, ...) on every shard."""
        return ray.get([s.call.remote(verb, *args) for s in self.shards])

    def shard_versions(self) -> list[int]:
        return [st["version"] for st in ray.get([s.stats.remote() for s in self.shards])]

    def advance_shards(self, step: int, which: list[int] | None = None) -> None:
        """Shards (``which``, default all) go on at version ``step``."""
        which = range(len(self.shards)) if which is None else which
        ray.get([self.shards[i].advance_to.remote(step) for i in which])

    def use_mode(self, mode: str) -> None:
        """The shards take up ``mode``'s rule, and it is the mode now (the workers' is given
        when they resume)."""
        ray.get([s.use_mode.remote(mode) for s in self.shards])
        self.mode = mode

    def roll_back(self, ckpt: files.Checkpoint) -> dict:
        """Every worker gone, every shard back to its checkpoint of job checkpoint ``ckpt``
        (each reads every old one's where their number changed) and the queue back to its data
        position. Returns the shards' versions, the slowest load and the position restored."""
        for w in self.workers:
            if w is not None:
                ray.kill(w, no_restart=True)
        sequences = ckpt.meta["shard_sequences"]
        resharded = len(sequences) != len(self.shards)
        if resharded:
            sources = [(str(job.shard_dir(self.checkpoint_dir, k)), seq)
                       for k, seq in enumerate(sequences)]
            loaded = ray.get([s.reshard.remote(sources) for s in self.shards], timeout=900)
        else:
            loaded = ray.get([s.rollback.remote(seq) for s, seq in
                              zip(self.shards, sequences)], timeout=300)
        queue = reshard.fold_queue(in_rows(ckpt.meta["queue"], self.cfg.train.batch_size),
                                   len(self.workers))
        ray.get(self.queue.restore.remote(queue))
        self.workers = [None] * len(self.workers)
        self.pending.clear()
        self.waiting.clear()
        return {"versions": [x["version"] for x in loaded],
                "load_s": max(x["load_s"] for x in loaded), "resharded": resharded,
                "shards_before": len(sequences), "workers_before": len(ckpt.meta["done"]),
                "queue": queue}

    def stop_all(self) -> None:
        """Every actor of the run ends now and is waited for (a run that failed: none trains
        on; a shard killed mid-write leaves a temporary file, which run/driver.py removes once no
        process of the run can write another)."""
        handles = [*(w for w in self.workers if w is not None), *self.shards, self.queue]
        if self.directory is not None:  # and its standbys (none if it does not answer)
            with contextlib.suppress(*ACTOR_GONE):
                handles += ray.get(self.directory.standby_handles.remote(), timeout=5)
            handles.append(self.directory)
        for h in handles:
            ray.kill(h, no_restart=True)
        ray.wait([h.__ray_ready__.remote() for h in handles], num_returns=len(handles),
                 timeout=STOP_WAIT_S)  # each answers with its death

    def kill(self, target: str, index: int) -> None:
        """Fault injection: the worker, PS shard or waiting standby ``index`` exits at once."""
        if target == "standby":
            ray.get(self.directory.standby_handles.remote())[index].die.remote()
            return
        (self.workers if target == "worker" else self.shards)[index].die.remote()

    def kill_in_next_write(self, index: int) -> None:
        """Fault injection: PS shard ``index`` exits in the middle of its next checkpoint write
        (its death is then seen as any failure from outside is: downtime from its last answer)."""
        self.shards[index].die_in_next_write.remote()
