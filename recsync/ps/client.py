"""PSClient: a worker's view of the parameter server. One pull and one push call per shard per
step, carrying every table's ids for that shard as int64 arrays (deduplicated).

It serves the same ``pull(sparse) -> PulledBatch`` as LocalLookup, so ``train_step`` and
``evaluate`` run unchanged against a sharded PS.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import ray
import torch

from recsync.embedding.lookup import PulledBatch, dedup, fuse
from recsync.embedding.sharding import split_by_shard


@dataclass
class Placement:
    """Where each table's unique ids of one batch live: positions per (table, shard)."""

    positions: list[list[torch.Tensor]]  # [table][shard] -> positions into the table's ids

    def ids_for(self, ids: list[torch.Tensor], shard: int) -> list[np.ndarray]:
        return [ids[t][p[shard]].numpy() for t, p in enumerate(self.positions)]


@dataclass
class PendingPull:
    """A pull sent to every shard, not yet waited for."""

    tables: list[tuple[torch.Tensor, torch.Tensor]]  # per table: (unique ids, inverse)
    placement: Placement
    refs: list  # one answer per shard
    min_version: int = 0


SHARD_RESTART_TIMEOUT_S = 120  # partial recovery: how long a pull waits for a shard to return


class PSClient:
    """Not thread-safe: one per worker thread."""

    def __init__(self, shards: list, dims: list[int], dense_shard: int | None = None,
                 push_window: int = 2, survive_shard_restarts: bool = False,
                 ssu_rate: float = 0.0, seed: int = 0):
        """``survive_shard_restarts`` (full or partial recovery): a pull from a shard that died
        waits for Ray to restart it (it reloads its last checkpoint) and asks again; pushes that
        were in flight to it are lost, and counted in ``lost_pushes``. ``ssu_rate`` (CPR-SSU):
        each push marks the rows touched by this share of its batch's samples (drawn with
        ``seed``), which the shards record for their partial checkpoints."""
        self.shards, self.dims = shards, dims
        self.survive_shard_restarts = survive_shard_restarts
        self.lost_pushes = 0
        self.dense_shard = dense_shard
        self.ssu_rate = ssu_rate
        self._ssu_rng = np.random.default_rng(seed)
        self.push_window = push_window
        self._in_flight: deque = deque()
        self.staleness: list[int] = []
        self.last_dense: np.ndarray | None = None
        self.last_versions: list[int] = []
        self.seen_versions: list[int] = []  # per shard, the newest version any answer carried

    def pull(self, sparse: torch.Tensor, min_version: int = 0) -> PulledBatch:
        """Rows for a batch's ids (int64 [B, T]). Blocks until every shard answered.

        ``min_version``: each shard first waits until it has applied that many updates (sync).
        The dense vector (if a shard holds it) and each shard's version are kept in
        ``last_dense`` and ``last_versions``; the batch also carries its placement for push.
        """
        return self.complete(self.pull_async(sparse, min_version))

    def pull_async(self, sparse: torch.Tensor, min_version: int = 0) -> PendingPull:
        """Send a batch's pull to every shard and return at once; ``complete`` waits for it."""
        tables = dedup(sparse)
        ids = [u for u, _ in tables]
        placement = Placement([split_by_shard(u, len(self.shards)) for u in ids])
        refs = [s.pull.remote(placement.ids_for(ids, i), min_version)
                for i, s in enumerate(self.shards)]
        return PendingPull(tables, placement, refs, min_version)

    def _answers(self, pending: PendingPull) -> list:
        if not self.survive_shard_restarts:
            return ray.get(pending.refs)
        ids = [u for u, _ in pending.tables]
        answers = []
        for i, ref in enumerate(pending.refs):
            deadline = time.monotonic() + SHARD_RESTART_TIMEOUT_S
            while True:
                try:
                    answers.append(ray.get(ref))
                    break
                except ray.exceptions.RayActorError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)  # Ray is restarting the shard: ask the new one
                    ref = self.shards[i].pull.remote(pending.placement.ids_for(ids, i),
                                                     pending.min_version)
        return answers

    def _wait_push(self, ref):
        """The result of a push (its staleness, or whether a sync step completed); a push to
        a shard that died is lost if partial recovery is on (None)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError:
            if not self.survive_shard_restarts:
                raise
            self.lost_pushes += 1
            return None

    def complete(self, pending: PendingPull) -> PulledBatch:
        """Wait for a pull's answers and merge them. The batch carries the version each shard
        read (``versions``), whatever order pulls complete in."""
        answers = self._answers(pending)
        ids = [u for u, _ in pending.tables]
        # merged in numpy: Ray hands back read-only arrays, which numpy copies from freely
        rows = [np.empty((len(u), d), np.float32) for u, d in zip(ids, self.dims)]
        for s, (shard_rows, dense, _) in enumerate(answers):
            for t, r in enumerate(shard_rows):
                rows[t][pending.placement.positions[t][s].numpy()] = r
            if dense is not None:
                self.last_dense = dense
        self.last_versions = [a[2] for a in answers]
        self._see(self.last_versions)
        pulled = fuse([(u, inv, torch.from_numpy(r)) for (u, inv), r in
                       zip(pending.tables, rows)])
        pulled.placement = pending.placement
        pulled.versions = list(self.last_versions)
        return pulled

    def known_versions(self, pending: PendingPull | None = None) -> list[int]:
        """The newest version of each shard this client has seen, counting the answers of
        ``pending`` that have already arrived (without waiting for the others)."""
        if pending is not None:
            self._see([self._arrived_version(r) for r in pending.refs])
        return list(self.seen_versions)

    def _arrived_version(self, ref) -> int:
        """The version in a pull answer if it has arrived, else -1 (also if its shard died:
        ``complete`` asks again)."""
        if not ray.wait([ref], num_returns=1, timeout=0)[0]:
            return -1
        try:
            return ray.get(ref)[2]
        except ray.exceptions.RayActorError:
            return -1

    def _see(self, versions: list[int]) -> None:
        if not self.seen_versions:
            self.seen_versions = [-1] * len(self.shards)
        self.seen_versions = [max(a, b) for a, b in zip(self.seen_versions, versions)]

    def _grads_for(self, pulled: PulledBatch, shard: int, scale: float) -> list[np.ndarray]:
        grads = pulled.row_grads()
        out = [g[p[shard]] for g, p in zip(grads, pulled.placement.positions)]  # gathers: copies
        return [(g * scale if scale != 1.0 else g).numpy() for g in out]

    def push(self, pulled: PulledBatch, dense_grad: np.ndarray | None = None,
             lr_scales: list[float] | None = None) -> None:
        """Async: send each shard its rows' gradients (and the dense one to its shard) with the
        version read at pull. Returns at once unless ``push_window`` pushes are in flight, in
        which case it first waits for the oldest (and records its staleness). ``lr_scales``:
        a learning-rate multiplier per shard for this update (eager)."""
        versions = getattr(pulled, "versions", None) or self.last_versions
        self._push_each(lambda s, shard, ids, grads, dense, sampled: shard.push.remote(
            ids, grads, dense, versions[s], 1.0 if lr_scales is None else lr_scales[s],
            sampled), pulled, dense_grad, 1.0)

    def push_gba(self, pulled: PulledBatch, dense_grad: np.ndarray, samples: int) -> None:
        """GBA: like ``push``, with gradients x ``samples`` and the version read at pull as the
        token of each shard's gradient. Does not wait for the shards' aggregation."""
        self._push_each(lambda s, shard, ids, grads, dense, sampled: shard.push_gba.remote(
            ids, grads, dense, self.last_versions[s], samples, sampled), pulled, dense_grad,
            float(samples))

    def _push_each(self, send, pulled: PulledBatch, dense_grad: np.ndarray | None,
                   scale: float) -> None:
        sampled = self._sampled(pulled)
        for s, shard in enumerate(self.shards):
            dense = None
            if s == self.dense_shard and dense_grad is not None:
                dense = dense_grad * scale if scale != 1.0 else dense_grad
            self._in_flight.append(send(s, shard, pulled.placement.ids_for(pulled.ids, s),
                                        self._grads_for(pulled, s, scale), dense,
                                        self._sampled_on(sampled, pulled, s)))
        while len(self._in_flight) > self.push_window * len(self.shards):
            result = self._wait_push(self._in_flight.popleft())
            if result is not None:
                self.staleness.append(result)

    def push_sync(self, step: int, pulled: PulledBatch | None, samples: int) -> None:
        """Sync: contribute this worker's row gradients x ``samples`` to ``step`` on every shard.

        A worker with no batch this step still pushes (nothing, 0 samples), so that every
        shard counts all workers. Waits for the previous step's pushes first (bounded memory,
        and a failed shard surfaces here).
        """
        self.flush()
        sampled = None if pulled is None else self._sampled(pulled)
        for s, shard in enumerate(self.shards):
            if pulled is None:
                ids = [np.empty(0, np.int64) for _ in self.dims]
                grads = [np.empty((0, d), np.float32) for d in self.dims]
            else:
                ids = pulled.placement.ids_for(pulled.ids, s)
                grads = self._grads_for(pulled, s, float(samples))
            self._in_flight.append(shard.push_sync.remote(
                step, ids, grads, None, samples, self._sampled_on(sampled, pulled, s)))

    def _sampled(self, pulled: PulledBatch) -> list[torch.Tensor] | None:
        """SSU: per table, a mask over the batch's unique ids: touched by a sampled sample."""
        if not self.ssu_rate:
            return None
        keep = torch.from_numpy(self._ssu_rng.random(pulled.index.shape[0]) < self.ssu_rate)
        mask = torch.zeros(len(pulled.rows), dtype=torch.bool)
        mask[pulled.index[keep].reshape(-1)] = True
        return list(mask.split([len(i) for i in pulled.ids]))

    @staticmethod
    def _sampled_on(sampled, pulled: PulledBatch, shard: int) -> list[np.ndarray] | None:
        if sampled is None:
            return None
        return [m[p[shard]].numpy() for m, p in zip(sampled, pulled.placement.positions)]

    def flush(self) -> None:
        """Wait until every push sent so far has been applied (raises if a shard died, unless
        partial recovery is on: then the pushes it lost are counted)."""
        while self._in_flight:
            result = self._wait_push(self._in_flight.popleft())
            if result is not None and not isinstance(result, bool):
                self.staleness.append(result)
