"""PSShard: the Ray actor around ShardCore. Thin: unpack, call the core, pack.

It is an asyncio actor so that a sync-mode pull can wait (``min_version``) for the previous step
to be applied while pushes from other workers are still being served; the methods never await
in the middle of an update, so updates are applied one at a time, in arrival order.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import ray

from recsync.checkpoint import files, reshard
from recsync.checkpoint.writer import CheckpointWriter
from recsync.cluster import storage
from recsync.cluster.emulation import EmulatedMachine, RequestPacer, idle_cores_async
from recsync.cluster.placement import where
from recsync.ps.channel_server import ChannelServer
from recsync.ps.channel_shm import answer_array
from recsync.ps.core import ShardCore
from recsync.run.signals import ignore_interrupts


def nbytes(x) -> int:
    """Bytes of the arrays in a call's arguments or answer (lists and tuples of arrays)."""
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(nbytes(v) for v in x)
    return 0


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class PSShard:
    def __init__(self, build_core, network: tuple[float, float] | None = None,
                 checkpoint_dir: str | None = None, keep: int = 2, cores: float = 0.0,
                 warm_with=None):
        """``build_core()`` returns this shard's ShardCore (built here, in the actor); None: a
        warm standby (ps/standby.py), which holds nothing until it ``take_over`` s a shard.
        ``network``: (latency s, s per byte) of an EMULATED network: every pull and push waits
        half the latency plus its request's bytes before it is served, and half the latency
        (plus the answer's bytes) before it answers. Other calls are served meanwhile.
        ``checkpoint_dir``: where ``checkpoint`` writes this shard's checkpoints. ``cores``
        (> 0): the EMULATED cluster's cores of this shard, on which pulls and pushes are paced
        (recsync/cluster/emulation.py). ``warm_with`` (a standby): a core builder whose core is
        built and dropped at once, so that a take-over finds what building one imports (torch's
        optimizers: 1.3 s in the first measurement) already imported."""
        ignore_interrupts()
        self.core: ShardCore | None = build_core() if build_core is not None else None
        if build_core is None and warm_with is not None:
            warm_with()
        self._changed = asyncio.Condition()
        self._copying = asyncio.Lock()  # a checkpoint's rows are being copied (rows_copy.py)
        self.network = network
        self.pacer = RequestPacer(EmulatedMachine(cores)) if cores > 0 else None
        self.restored: dict | None = None
        self.checkpoint_dir = checkpoint_dir
        self.base: int | None = None  # the full checkpoint partial ones now apply to
        if checkpoint_dir is not None and ray.get_runtime_context().was_current_actor_reconstructed:
            self.restored = self._restore()  # Ray restarted us: partial or full recovery
        self.keep = keep
        self.writer = (CheckpointWriter(checkpoint_dir, keep=keep)
                       if checkpoint_dir is not None else None)
        self.ready_unix = time.time()
        self.first_pull_unix: float | None = None  # since it started, or since a rollback
        self.node = where()  # this process's node: the run lists each actor's
        self._channel: ChannelServer | None = None

    async def take_over(self, build_core, checkpoint_dir: str) -> dict:
        """A warm standby becomes the shard whose core ``build_core`` builds, from that
        shard's last checkpoint chain in ``checkpoint_dir`` (from scratch if there is none
        yet). Returns what it reloaded, with the time the take-over took (``take_over_s``)."""
        if self.core is not None:
            raise RuntimeError(f"this process already serves shard {self.core.store.shard}")
        begin = time.perf_counter()
        self.core = build_core()
        self.checkpoint_dir = checkpoint_dir
        self.restored = self._restore()
        self.writer = CheckpointWriter(checkpoint_dir, keep=self.keep)
        self.ready_unix = time.time()
        self.restored["take_over_s"] = time.perf_counter() - begin
        return {**self.restored, "pid": os.getpid()}

    def _restore(self) -> dict:
        begin = time.perf_counter()
        storage.pull_dir(self.checkpoint_dir)  # written on another node: fetched first
        chain = files.latest_chain(self.checkpoint_dir)  # raises if none is complete
        # data files without their manifest: writes the death interrupted (overwritten next)
        interrupted = files.interrupted(self.checkpoint_dir)
        if not chain:
            return {"sequence": None, "version": 0, "skipped": [], "load_s": 0.0,
                    "interrupted": interrupted}
        self._restore_chain(chain)
        return {"sequence": chain[-1].sequence, "version": self.core.version,
                "skipped": chain[-1].skipped, "chain": len(chain),
                "interrupted": interrupted, "load_s": time.perf_counter() - begin}

    def _restore_chain(self, chain: list[files.Checkpoint]) -> None:
        self.core.restore_chain([(c.arrays, c.meta) for c in chain])
        self.base = chain[0].sequence

    async def rollback(self, sequence: int) -> dict:
        """Full recovery and resume: go back to checkpoint ``sequence`` of this shard (written
        or waiting to be: the writer is flushed first). Returns its version and the load time."""
        begin = time.perf_counter()
        async with self._copying:
            if self.writer is not None:
                self.writer.flush()
            storage.pull_dir(self.checkpoint_dir)
            self._restore_chain(files.chain(self.checkpoint_dir, sequence))
        self.first_pull_unix = None  # the downtime of a full recovery ends at the next pull
        return {"version": self.core.version, "load_s": time.perf_counter() - begin}

    async def reshard(self, sources: list[tuple[str, int]]) -> dict:
        """Resume onto other shards: become this shard's part of the checkpoints ``sources``
        ((directory, sequence) of each old shard, in order) that a job checkpoint of a run
        with ``len(sources)`` shards names, reading one old shard's chain at a time
        (checkpoint/reshard.py). The next checkpoint is a full one."""
        begin = time.perf_counter()
        async with self._copying:
            if self.writer is not None:
                self.writer.flush()
            store = self.core.store
            for directory, _ in sources:
                storage.pull_dir(directory)
            arrays, meta = reshard.snapshot_for(reshard.load_resolved(sources), len(sources),
                                                store.shard, store.num_shards,
                                                self.core.rule.snapshot(), self.core.mode)
            self.core.restore(arrays, meta)
        self.base = None
        return {"version": self.core.version, "load_s": time.perf_counter() - begin}

    async def warm_start(self, arrays: dict[str, np.ndarray]) -> int:
        """``train.init_from``: hold these rows (a snapshot's ``t{i}.local/weights/state``)
        before training starts; returns how many."""
        async with self._copying:
            self.core.store.restore(arrays)
        return self.core.store.num_initialized()

    async def incarnation(self) -> dict:
        """This process's pid, when it was ready, the checkpoint it reloaded if Ray restarted
        it or it took a dead shard over, and when it served its first pull (since it started,
        or since a rollback). A standby that holds no shard yet has version None."""
        version = self.core.version if self.core is not None else None
        return {**self.node, "restored": self.restored, "version": version,
                "ready_unix": self.ready_unix, "first_pull_unix": self.first_pull_unix}

    async def channel(self) -> dict:
        """The address and key of this process's direct data path (ps/channel.py), which
        serves ``pull`` and ``push`` as these methods do; started at the first ask."""
        if self._channel is None:
            self._channel = ChannelServer({"pull": self.pull, "push": self.push},
                                          asyncio.get_running_loop(), self.node["node_ip"])
        return self._channel.address

    async def where(self) -> dict:
        """This process's node and pid (a standby's too)."""
        return self.node

    async def measure_idle(self) -> float | None:
        """The emulated cluster: measure this process's CPU while idle (Ray's threads), which
        its machine then does not charge to requests (cluster/emulation.py). Called as training
        starts, while the workers measure theirs and send nothing. None without emulation."""
        if self.pacer is None:
            return None
        cores = await idle_cores_async()
        self.pacer.machine.set_idle(cores)
        return cores

    async def _travel(self, payload) -> None:
        if self.network is not None:
            latency_s, s_per_byte = self.network
            await asyncio.sleep(latency_s / 2 + nbytes(payload) * s_per_byte)

    async def pull(self, ids: list[np.ndarray], min_version: int = 0, read_only: bool = False,
                   dense: str = "vector"):
        """Rows of ``ids`` per table (int64, unique, owned here), dense vector or None, version.

        Waits until the shard's version is at least ``min_version`` (modes whose steps wait
        for the previous ones). ``read_only``: an evaluation's pull (ShardCore.pull).
        ``dense``: what of the dense parameters comes with it (ShardCore.pull).
        """
        await self._travel(ids)
        if self.core.version < min_version:
            async with self._changed:
                await self._changed.wait_for(lambda: self.core.version >= min_version)
        paced = self.pacer and self.pacer.start()
        answer = self.core.pull(ids, read_only, dense, out=answer_array)
        if paced:
            await self.pacer.finish(paced)
        await self._travel(answer)
        if self.first_pull_unix is None:
            self.first_pull_unix = time.time()
        return answer

    async def push(self, ids, grads, dense_grad, meta: dict):
        """One worker's push (rows' gradients per table, the dense gradient if this shard holds
        the dense parameters, and what the mode sends with it), handed to the mode's rule.
        Returns what ShardCore.push returns (with the dense vector if ``meta["read_dense"]``)."""
        await self._travel((ids, grads, dense_grad))
        version = self.core.version
        paced = self.pacer and self.pacer.start()
        result = self.core.push(ids, grads, dense_grad, meta)
        if paced:
            await self.pacer.finish(paced)
        if self.core.version != version:
            await self._notify()
        await self._travel(result[1] if meta.get("read_dense") else None)
        return result

    async def call(self, verb: str, *args):
        """A verb of the mode's rule (modes/base.py ShardRule): ``end``, ``drop_incomplete``,
        ``model_dense``, or one a mode adds (EASGD's ``exchange``)."""
        method = getattr(self.core.rule, verb, None)
        if verb.startswith("_") or not callable(method):
            raise ValueError(f"the rule of mode {self.core.mode!r} has no verb {verb!r}")
        version = self.core.version
        result = method(self.core, *args)
        if self.core.version != version:
            await self._notify()
        return result

    async def use_mode(self, mode: str) -> None:
        self.core.use_mode(mode)

    async def advance_to(self, version: int) -> None:
        self.core.advance_to(version)
        await self._notify()

    async def install_dense(self, params, optimizer: str, lr: float, optimizer_state,
                            weight_decay: float = 0.0, warmup_steps: int = 0) -> None:
        self.core.install_dense(params, optimizer, lr, optimizer_state, weight_decay,
                                warmup_steps)

    async def take_dense(self) -> dict:
        return self.core.take_dense()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def checkpoint(self, keep_from: int | None = None) -> dict:
        """Snapshot this shard's state and hand it to the background writer. The rows are
        copied on a thread while calls go on being served (a push saves a row the copy has not
        reached first: embedding/rows_copy.py), so the snapshot is the state when it began.
        Returns the sequence number and the time calls were held by it (``blocked_s``: the
        snapshot's start, pushes waiting for the copy, a full writer queue), the copy's
        wall time (``copy_s``) and the whole call's (``snapshot_s``).
        ``keep_from``: keep this shard's checkpoints from that sequence on (a job checkpoint
        names them)."""
        if self.writer is None:
            raise ValueError("this shard was started without a checkpoint directory")
        async with self._copying:
            begin = time.perf_counter()
            partial = self.base is not None and self.core.next_snapshot_partial()
            copy, arrays, meta = self.core.begin_snapshot(partial)
            start_s = time.perf_counter() - begin
            try:
                arrays.update(await asyncio.to_thread(copy.run))
            finally:
                self.core.store.copying = None
            self.core.end_snapshot(copy, meta)
            if partial:
                meta["base"] = self.base
            queued = time.perf_counter()
            sequence = self.writer.save(arrays, meta, keep_from)  # waits if two are pending
            save_s = time.perf_counter() - queued
        if not partial:
            self.base = sequence
        return {"sequence": sequence, "partial": partial, "pid": os.getpid(),
                "rows": meta["rows"], "version": meta["version"],
                "blocked_s": start_s + copy.held_s + save_s, "start_s": start_s,
                "held_s": copy.held_s, "save_s": save_s, "copy_s": copy.copy_s,
                "saved_early": copy.saved_early, "snapshot_s": time.perf_counter() - begin}

    async def checkpoints_written(self) -> list[dict]:
        """Wait until every checkpoint handed to the writer is on disk (calls are served
        meanwhile); what was written."""
        if self.writer is None:
            return []
        await asyncio.to_thread(self.writer.flush)
        return list(self.writer.written)

    async def trained_rows(self, with_state: bool = False) -> list:
        """The trained model's rows held here, by global id (the run's model directory)."""
        return self.core.trained_rows(with_state)

    async def dense_optimizer_state(self) -> dict | None:
        return self.core.dense_optimizer_state()

    async def stats(self) -> dict:
        return {**self.core.stats(), "pid": os.getpid(),  # the process serving it at the end
                "pacing": self.pacer.machine.totals() if self.pacer is not None else None,
                # the direct data path of this process: clients served, connections refused
                # for want of the key (None: no client asked for it)
                "channel": None if self._channel is None else {
                    "connections": self._channel.connections, "refused": self._channel.refused}}

    async def staleness(self) -> dict[int, int]:
        """{staleness: gradients} applied so far (cheap: the watch loop asks every poll)."""
        return dict(self.core.staleness)

    def die(self) -> None:
        """Fault injection: the process exits at once, as a crashed machine would."""
        os._exit(1)

    async def die_in_next_write(self) -> None:
        """Fault injection: the process exits in the middle of its next checkpoint write (its
        data file on disk, its manifest not), as a machine crashing while it writes would."""
        if self.writer is None:
            raise ValueError("this shard writes no checkpoints (recovery is off)")
        self.writer.before_manifest = lambda: os._exit(1)
