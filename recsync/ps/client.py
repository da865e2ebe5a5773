"""PSClient: a worker's view of the parameter server. One pull and one push call per shard per
step, carrying every table's ids for that shard as int64 arrays (deduplicated).

It serves the same ``pull(batch) -> PulledBatch`` as LocalLookup, so ``evaluate`` runs
unchanged against a sharded PS. A pulled batch carries the version each shard read and the dense
vector if a shard holds it; a push carries the mode's own fields (``meta``) to the shard's rule.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import ray
import torch

from recsync.embedding.lookup import LookupPlan, PulledBatch
from recsync.embedding.sharding import split_by_shard
from recsync.embedding.spec import TableSpec
from recsync.ps.channel import ShardChannel, ShardGone, failed

SHARD_GONE = (ray.exceptions.RayActorError, ShardGone)  # a shard's process ended


@dataclass
class ShardRouting:
    """Where each table's unique ids of one batch live: positions per (table, shard)."""

    positions: list[list[torch.Tensor]]  # [table][shard] -> positions into the table's ids
    shards: int
    shard_ids: list[list[np.ndarray]] | None = None  # [shard][table]: the ids the pull sent

    def ids_for(self, ids: list[torch.Tensor], shard: int) -> list[np.ndarray]:
        return [ids[t].index_select(0, p[shard]).numpy() for t, p in enumerate(self.positions)]

    def by_shard(self, values: list[torch.Tensor]) -> list[list[np.ndarray]]:
        """``values[t]`` (a row per unique id of table t) split by shard, [shard][table]: one
        gather per table (its shards' positions, one after another, are one order), not one
        per table and shard (208 small copies a step at 26 tables on 8 shards)."""
        out: list[list[np.ndarray]] = [[] for _ in range(self.shards)]
        for v, p in zip(values, self.positions):
            gathered = v.index_select(0, torch.cat(p))
            for s, part in enumerate(torch.split(gathered, [x.shape[0] for x in p])):
                out[s].append(part.numpy())
        return out


@dataclass
class PendingPull:
    """A pull sent to every shard, not yet waited for."""

    batch: object
    tables: list[tuple[torch.Tensor, torch.Tensor]]  # per table: (unique ids, inverse)
    routing: ShardRouting
    refs: list  # one answer per shard
    min_version: int = 0
    read_only: bool = False  # an evaluation's: a dynamic table admits, evicts and scores nothing
    dense: str = "vector"  # what of the dense parameters comes with it (ShardCore.pull)
    sent_at: float = 0.0  # when it was sent (PSClient._now)


SHARD_RESTART_TIMEOUT_S = 120  # partial recovery: how long a pull waits for a shard to return


class PSClient:
    """Not thread-safe: one per worker thread."""

    def __init__(self, shards: list, plan: LookupPlan | list[int], dense_shard: int | None = None,
                 push_window: int = 2, survive_shard_restarts: bool = False,
                 ssu_rate: float = 0.0, seed: int = 0, directory=None,
                 transport: str = "ray"):
        """``survive_shard_restarts`` (full or partial recovery): a pull from a shard that died
        waits for its new process (a standby that took it over, from ``directory``, the run's
        ShardDirectory; without one, Ray's restart of it), which reloaded its last checkpoint,
        and asks again; ``shards`` (shared by a worker's clients) then holds the new process.
        Pushes that were in flight to it are lost, and counted in ``lost_pushes`` (the worker
        reports them).
        ``dense_shard``: the shard that holds the dense parameters, if any. ``ssu_rate`` (CPR-SSU):
        each push marks the rows touched by this share of its batch's samples (drawn with
        ``seed``), which the shards record for their partial checkpoints. ``transport``
        (``cluster.transport``): "direct", pulls and pushes over a connection to each shard
        (ps/channel.py; ``close`` ends them), or "ray", as Ray actor calls."""
        if not isinstance(plan, LookupPlan):  # a list of dims: single-hot, one table each
            plan = LookupPlan.single_hot([TableSpec(f"t{i}", 1, d) for i, d in enumerate(plan)])
        self.shards, self.plan, self.dims = shards, plan, plan.dims
        self.survive_shard_restarts, self.directory = survive_shard_restarts, directory
        self.lost_pushes = 0
        # training pulls' round trips: from the sends until the worker has every answer (a
        # pull sent ahead, as eager's: until it asked for them), summed, and their number
        # (the worker reports them: what a call takes beyond the shard's own work)
        self.pull_round_trip_s, self.pulls_timed = 0.0, 0
        self.dense_shard = dense_shard
        self.ssu_rate = ssu_rate
        self._ssu_rng = np.random.default_rng(seed)
        self.push_window = push_window
        self._in_flight: deque = deque()
        self._dense_ref = None  # the last push that asked for the dense vector back
        self.seen_versions: list[int] = []  # per shard, the newest version any answer carried
        self.device = torch.device("cpu")  # a GPU worker's: pulled rows go there
        self.transport = transport
        self._channels: dict[int, tuple[object, ShardChannel]] = {}  # shard -> (handle, ...)
        self._retired: list[ShardChannel] = []  # to shards replaced, with calls in flight

    # -- the transport -----------------------------------------------------------------------
    def _send(self, shard: int, verb: str, *args):
        """Call ``verb`` (pull or push) of a shard: a Ray ref, or a Future of its channel's.
        Never raises for a shard that is gone: waiting for the answer does (SHARD_GONE)."""
        handle = self.shards[shard]
        if self.transport == "ray":
            return getattr(handle, verb).remote(*args)
        known = self._channels.get(shard)
        if known is None or known[0] is not handle or known[1].broken is not None:
            if known is not None:
                self._retire(self._channels.pop(shard)[1])
            try:
                address = ray.get(handle.channel.remote())
            except SHARD_GONE as e:
                return failed(e)
            try:
                known = (handle, ShardChannel(address))
            except OSError as e:
                return failed(ShardGone(
                    f"cannot reach PS shard {shard}'s data port {address['host']}:"
                    f"{address['port']} ({e}); where nodes reach each other only on Ray's "
                    f"ports, set cluster.transport = \"ray\""))
            self._channels[shard] = known
        return known[1].call(verb, *args)

    def _retire(self, channel: ShardChannel) -> None:
        """A channel to a shard's former process: closed once no call waits on it."""
        self._retired.append(channel)
        for c in [c for c in self._retired if not c.pending()]:
            c.close()
            self._retired.remove(c)

    @staticmethod
    def _get(ref):
        return ref.result() if isinstance(ref, concurrent.futures.Future) else ray.get(ref)

    @staticmethod
    def _ready(ref) -> bool:
        if isinstance(ref, concurrent.futures.Future):
            return ref.done()
        return bool(ray.wait([ref], num_returns=1, timeout=0)[0])

    def close(self) -> None:
        """End this client's connections to the shards (waits for nothing in flight)."""
        for channel in [c for _, c in self._channels.values()] + self._retired:
            channel.close()
        self._channels.clear()
        self._retired.clear()

    def pull(self, batch, min_version: int = 0, read_only: bool = False) -> PulledBatch:
        """Rows for a batch's ids (data/reader.py Batch). Blocks until every shard answered.

        ``min_version``: each shard first waits until it has applied that many updates (modes
        whose steps wait for the previous ones). The batch carries its routing for push,
        each shard's version (``versions``) and the dense vector if a shard holds it
        (``dense``). ``read_only``: an evaluation's pull, which changes no dynamic table (no
        admission, eviction or scoring; ids without a row read zeros).
        """
        return self.complete(self.pull_async(batch, min_version, read_only))

    def pull_async(self, batch, min_version: int = 0, read_only: bool = False,
                   dense: str = "vector") -> PendingPull:
        """Send a batch's pull to every shard and return at once; ``complete`` waits for it.
        ``dense``: "vector", "none" (eager: ``dense_after_push``) or "with_state" (eager: the
        pulled batch's ``dense_optimizer`` holds the optimizer's state as read)."""
        tables = self.plan.dedup(batch)
        ids = [u for u, _ in tables]
        routing = ShardRouting([split_by_shard(u, len(self.shards)) for u in ids],
                               len(self.shards))
        routing.shard_ids = routing.by_shard(ids)
        sent_at = self._now()
        refs = [self._send(i, "pull", routing.shard_ids[i], min_version, read_only, dense)
                for i in range(len(self.shards))]
        return PendingPull(batch, tables, routing, refs, min_version, read_only, dense, sent_at)

    def _now(self) -> float:
        """The clock of ``pull_round_trip_s`` (the simulator's client: its simulated clock)."""
        return time.perf_counter()

    def _answers(self, pending: PendingPull) -> list:
        if not self.survive_shard_restarts:
            return [self._get(r) for r in pending.refs]
        ids = [u for u, _ in pending.tables]
        answers = []
        for i, ref in enumerate(pending.refs):
            deadline = time.monotonic() + SHARD_RESTART_TIMEOUT_S
            while True:
                try:
                    answers.append(self._get(ref))
                    break
                except SHARD_GONE:
                    if time.monotonic() > deadline:
                        raise
                    if self.directory is not None:  # a standby takes over: ask it
                        self.shards[i] = ray.get(self.directory.current.remote(i),
                                                 timeout=SHARD_RESTART_TIMEOUT_S)
                    else:
                        time.sleep(0.2)  # Ray is restarting the shard: ask the new one
                    ref = self._send(i, "pull", pending.routing.ids_for(ids, i),
                                     pending.min_version, pending.read_only, pending.dense)
        return answers

    def _wait_push(self, ref):
        """The result of a push (what the shard's rule returned); a push to a shard that died
        is lost if recovery is on (None), and counted once (``dense_after_push`` then reads
        the vector afresh instead of waiting for it again)."""
        try:
            return self._get(ref)
        except SHARD_GONE:
            if not self.survive_shard_restarts:
                raise
            self.lost_pushes += 1
            if ref is self._dense_ref:
                self._dense_ref = None
            return None

    def complete(self, pending: PendingPull) -> PulledBatch:
        """Wait for a pull's answers and merge them. The batch carries the version each shard
        read (``versions``), whatever order pulls complete in."""
        answers = self._answers(pending)
        if not pending.read_only:
            self.pull_round_trip_s += self._now() - pending.sent_at
            self.pulls_timed += 1
        ids = [u for u, _ in pending.tables]
        # merged in numpy: Ray hands back read-only arrays, which numpy copies from freely
        rows = [np.empty((len(u), d), np.float32) for u, d in zip(ids, self.dims)]
        dense_vector = dense_optimizer = None
        for s, (shard_rows, dense, _) in enumerate(answers):
            for t, r in enumerate(shard_rows):
                rows[t][pending.routing.positions[t][s].numpy()] = r
            if isinstance(dense, tuple):
                dense_vector, dense_optimizer = dense
            elif dense is not None:
                dense_vector = dense
        pulled = self.plan.fuse(pending.batch, pending.tables,
                                [torch.from_numpy(r) for r in rows])
        pulled.routing = pending.routing
        pulled.versions = [a[2] for a in answers]
        pulled.dense, pulled.dense_optimizer = dense_vector, dense_optimizer
        self._see(pulled.versions)
        return pulled.to(self.device)

    def known_versions(self, pending: PendingPull | None = None) -> list[int]:
        """The newest version of each shard this client has seen, counting the answers of
        ``pending`` that have already arrived (without waiting for the others)."""
        if pending is not None:
            self._see([self._arrived_version(r) for r in pending.refs])
        return list(self.seen_versions)

    def _arrived_version(self, ref) -> int:
        """The version in a pull answer if it has arrived, else -1 (also if its shard died:
        ``complete`` asks again)."""
        if not self._ready(ref):
            return -1
        try:
            return self._get(ref)[2]
        except SHARD_GONE:
            return -1

    def _see(self, versions: list[int]) -> None:
        if not self.seen_versions:
            self.seen_versions = [-1] * len(self.shards)
        self.seen_versions = [max(a, b) for a, b in zip(self.seen_versions, versions)]

    @staticmethod
    def _by_shard(pulled: PulledBatch, scale: float) -> tuple[list, list]:
        """([shard][table] ids, [shard][table] row gradients x ``scale``) of a pulled batch."""
        routing = pulled.routing
        grads = pulled.row_grads()
        grads = [g * scale for g in grads] if scale != 1.0 else grads
        return (routing.shard_ids or routing.by_shard(pulled.ids)), routing.by_shard(grads)

    def push(self, pulled: PulledBatch | None, dense_grad: np.ndarray | None = None, *,
             scale: float = 1.0, lr_scales: list[float] | None = None, read_dense: bool = False,
             dense_lr_scale: float | None = None, **meta) -> None:
        """Send each shard its rows' gradients x ``scale`` (and the dense one x ``scale`` to the
        shard that holds the dense parameters), with ``meta`` for the mode's rule plus, per
        shard, the version the batch read (``version_read``) and ``lr_scale`` (``lr_scales``:
        a learning-rate multiplier per shard, eager). ``pulled`` None: an empty push (0
        samples) to every shard, so that a step counts every worker. Returns at once unless
        ``push_window`` pushes per shard are in flight; then it first waits for the oldest.
        ``read_dense``: the shard that holds the dense parameters answers with them as this push
        left them (``dense_after_push``); ``dense_lr_scale``: the dense update's multiplier
        there, where it differs from its rows' (eager)."""
        sampled = None if pulled is None else self._sampled(pulled)
        if pulled is not None:
            ids_by, grads_by = self._by_shard(pulled, scale)
        for s in range(len(self.shards)):
            dense = None
            if s == self.dense_shard and dense_grad is not None:
                dense = dense_grad * scale if scale != 1.0 else dense_grad
            if pulled is None:
                ids = [np.empty(0, np.int64) for _ in self.dims]
                grads = [np.empty((0, d), np.float32) for d in self.dims]
            else:
                ids, grads = ids_by[s], grads_by[s]
            shard_meta = {**meta, "version_read": pulled.versions[s] if pulled else 0,
                          "lr_scale": 1.0 if lr_scales is None else lr_scales[s],
                          "sampled": self._sampled_on(sampled, pulled, s)}
            if s == self.dense_shard:
                if read_dense:
                    shard_meta["read_dense"] = True
                if dense_lr_scale is not None:
                    shard_meta["dense_lr_scale"] = dense_lr_scale
            ref = self._send(s, "push", ids, grads, dense, shard_meta)
            if shard_meta.get("read_dense"):
                self._dense_ref = ref
            self._in_flight.append(ref)
        while len(self._in_flight) > self.push_window * len(self.shards):
            self._wait_push(self._in_flight.popleft())

    def dense_after_push(self) -> tuple[np.ndarray, int]:
        """The dense vector and the version of its shard just after the last push sent with
        ``read_dense`` was applied (waits for it); if that push was lost with its shard, the
        shard's dense vector now (its new process's)."""
        ref, self._dense_ref = self._dense_ref, None
        answer = None if ref is None else self._wait_push(ref)
        if answer is None:  # no such push, or it was lost: ask every shard for no rows
            empty = torch.empty(0, dtype=torch.int64)
            tables = [(empty, empty) for _ in self.dims]
            routing = ShardRouting([split_by_shard(empty, len(self.shards)) for _ in self.dims],
                                   len(self.shards))
            refs = [self._send(i, "pull", routing.ids_for([empty] * len(self.dims), i), 0, True)
                    for i in range(len(self.shards))]
            pending = PendingPull(None, tables, routing, refs, read_only=True)
            answer = self._answers(pending)[self.dense_shard]
        _, dense, version = answer
        self.seen_versions[self.dense_shard] = max(self.seen_versions[self.dense_shard], version)
        return dense, version

    def _sampled(self, pulled: PulledBatch) -> list[torch.Tensor] | None:
        """SSU: per table, a mask over the batch's unique ids: touched by a sampled sample."""
        if not self.ssu_rate:
            return None
        keep = torch.from_numpy(self._ssu_rng.random(pulled.batch_size) < self.ssu_rate)
        return pulled.touched_by(keep)

    @staticmethod
    def _sampled_on(sampled, pulled: PulledBatch, shard: int) -> list[np.ndarray] | None:
        if sampled is None:
            return None
        return [m[p[shard]].numpy() for m, p in zip(sampled, pulled.routing.positions)]

    def flush(self) -> None:
        """Wait until every push sent so far has been applied (raises if a shard died, unless
        partial recovery is on: then the pushes it lost are counted)."""
        while self._in_flight:
            self._wait_push(self._in_flight.popleft())
