"""ShardCore: the logic of one parameter-server shard, plain Python (the Ray actor wraps it).

A shard owns the embedding rows ``id % num_shards == shard`` of every table (an EmbeddingStore)
and, in PS modes, may own the model's dense parameters as one flat vector with a server-side
torch optimizer. ``version`` counts the updates the shard has applied:

- async: every push is applied at once and bumps the version; its staleness is the version at
  apply time minus the version the worker read when it pulled.
- sync: the pushes of one step are summed (each worker pushes gradient x its sample count) and
  applied once all ``num_workers`` have arrived, divided by the total samples: the gradient of
  the mean loss over the global batch, whatever the split of samples between workers. The
  version then equals the number of completed steps.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from recsync.embedding.store import EmbeddingStore
from recsync.embedding.spec import TableSpec


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a``; arrays Ray hands over are read-only, so those are copied."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


class DenseState:
    """Dense parameters as one flat float32 vector, updated by a torch optimizer."""

    def __init__(self, initial: torch.Tensor, optimizer: str, lr: float):
        from recsync.trainer import DENSE_OPTIMIZERS
        self.params = initial.detach().clone().requires_grad_(True)
        self.optimizer = DENSE_OPTIMIZERS[optimizer]([self.params], lr=lr)

    def apply(self, grad: torch.Tensor, lr_scale: float = 1.0) -> None:
        self.params.grad = grad
        if lr_scale != 1.0:
            for g in self.optimizer.param_groups:
                g.setdefault("base_lr", g["lr"])
                g["lr"] = g["base_lr"] * lr_scale
        self.optimizer.step()
        for g in self.optimizer.param_groups:
            if "base_lr" in g:
                g["lr"] = g["base_lr"]


class ShardCore:
    """One shard's rows, optional dense parameters, version, and push statistics."""

    def __init__(self, tables: list[TableSpec], row_optimizer, *, shard: int, num_shards: int,
                 num_workers: int, seed: int = 0, init_scale: float = 0.05,
                 dense: DenseState | None = None):
        self.store = EmbeddingStore(tables, row_optimizer, seed=seed, init_scale=init_scale,
                                    shard=shard, num_shards=num_shards)
        self.dense, self.num_workers = dense, num_workers
        self.version = 0
        self.staleness: Counter = Counter()  # staleness -> applied async pushes (bounded)
        self.pulls = self.pushes = 0
        self._pending: dict[int, list] = {}  # sync step -> [(ids, grads, dense, samples), ...]

    def pull(self, ids: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray | None, int]:
        """Rows of each table's ``ids`` (int64, owned here), the dense vector if held, version."""
        self.pulls += 1
        rows = [self.store.pull(t, _tensor(i)).numpy() for t, i in enumerate(ids)]
        dense = self.dense.params.detach().numpy().copy() if self.dense is not None else None
        return rows, dense, self.version

    def push(self, ids: list[np.ndarray], grads: list[np.ndarray], dense_grad: np.ndarray | None,
             version_read: int, lr_scale: float = 1.0) -> int:
        """Apply one worker's gradients now (async); return the staleness of this update."""
        self._check_dense(dense_grad)
        staleness = self.version - version_read
        self._apply(ids, grads, dense_grad, lr_scale)
        self.staleness[staleness] += 1
        self.pushes += 1
        self.version += 1
        return staleness

    def push_sync(self, step: int, ids: list[np.ndarray], grads: list[np.ndarray],
                  dense_grad: np.ndarray | None, samples: int) -> bool:
        """Add one worker's contribution to ``step`` (grads already x ``samples``).

        Applies the step when all workers have pushed it; returns whether it was applied.
        """
        if step != self.version:
            raise ValueError(f"sync push for step {step}, but the shard is at step {self.version}")
        self._check_dense(dense_grad)  # before queueing: a bad push must not poison the step
        pending = self._pending.setdefault(step, [])
        pending.append((ids, grads, dense_grad, samples))
        self.pushes += 1
        if len(pending) < self.num_workers:
            return False
        total = sum(p[3] for p in pending)
        if total > 0:
            merged_ids, merged_grads = [], []
            for t in range(len(self.store.tables)):
                ids_t = _tensor(np.concatenate([p[0][t] for p in pending]))
                grads_t = _tensor(np.concatenate([p[1][t] for p in pending]))
                uniq, inverse = torch.unique(ids_t, return_inverse=True)
                summed = torch.zeros(len(uniq), grads_t.shape[1]).index_add_(0, inverse, grads_t)
                merged_ids.append(uniq.numpy())
                merged_grads.append((summed / total).numpy())
            dense_grads = [p[2] for p in pending if p[2] is not None]  # 0-sample pushes: None
            dense = sum(dense_grads) / total if dense_grads else None
            self._apply(merged_ids, merged_grads, dense, 1.0)
        del self._pending[step]
        self.staleness[0] += len(pending)  # sync: every gradient applied to the version it read
        self.version += 1
        return True

    def drop_pending(self) -> int:
        """Forget the contributions to a sync step that will never complete (a worker died
        before pushing it; the group is rebuilt and redoes the step). Returns how many."""
        dropped = sum(len(p) for p in self._pending.values())
        self._pending.clear()
        return dropped

    def _check_dense(self, dense_grad) -> None:
        if dense_grad is not None and self.dense is None:
            raise ValueError("a dense gradient was pushed to a shard that holds no dense "
                             "parameters")

    def _apply(self, ids, grads, dense_grad, lr_scale: float) -> None:
        for t, (i, g) in enumerate(zip(ids, grads)):
            if len(i):
                self.store.push(t, _tensor(i), _tensor(g), lr_scale)
        if dense_grad is not None:
            self.dense.apply(_tensor(dense_grad), lr_scale)

    def stats(self) -> dict:
        return {"version": self.version, "pulls": self.pulls, "pushes": self.pushes,
                "rows_touched": self.store.num_initialized(),
                "staleness": dict(self.staleness)}
