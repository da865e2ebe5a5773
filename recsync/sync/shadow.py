"""Modes "shadow" and "foreground" (ShadowSync, DESIGN §6.4): Hogwild threads on a trainer's
dense replica, and the synchronization that keeps the trainers' replicas in step.

- ``DenseReplica``: the dense parameters one trainer's threads share. Every write (the Hogwild
  threads' optimizer steps, the synchronizer's moves) goes through ``.data`` aliases: an
  in-place write on an autograd leaf bumps its version counter and makes the backward pass that
  another thread is running at that moment fail (DESIGN §2). Forward and backward run without
  any lock; only the optimizer step itself (a few element-wise ops) is serialized, because a
  torch optimizer reads its gradients from ``.grad`` and keeps one state per parameter.
- ``HogwildStep``: one thread's step: pull the batch's rows from the PS, forward, backward (the
  gradients returned, not accumulated in shared ``.grad``), update the replica, push the row
  gradients (embeddings are trained asynchronously on the PS, as in mode async).
- Synchronizers, one round each: ``ElasticSync`` (EASGD; the center copy lives on PS shard 0,
  which computes the move),
  ``AveragingSync`` (MA, and BMUF with its block momentum) over a process group of their own.
  ``round(done)`` carries whether this trainer has finished training; the all-reduce adds the
  flags up, so every trainer learns in the same round that all are done and stops after it:
  no collective is ever left waiting for a trainer that has stopped.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import ray
import torch
import torch.nn.functional as F

from recsync.data.reader import Batch
from recsync.ps.aggregation import as_tensor
from recsync.ps.client import PSClient
from recsync.sync.base import STOP, Mode
from recsync.sync.shadow_rules import BMUF, mean_of


class DenseReplica:
    """A trainer's dense parameters, written only through ``.data`` aliases (see above)."""

    def __init__(self, model: torch.nn.Module, optimizer_cls, lr: float):
        self.model = model
        self.params = list(model.parameters())
        self.data = [p.data for p in self.params]  # same storage, outside autograd
        self.numels = [p.numel() for p in self.params]
        self.optimizer = optimizer_cls(self.data, lr=lr)
        self._update = threading.Lock()

    def apply(self, grads: list[torch.Tensor]) -> None:
        """One optimizer step with this thread's gradients."""
        with self._update:
            for d, g in zip(self.data, grads):
                d.grad = g
            self.optimizer.step()
            for d in self.data:
                d.grad = None

    def vector(self) -> torch.Tensor:
        """A flat copy of the parameters (in ``model.parameters()`` order)."""
        return torch.cat([d.reshape(-1) for d in self.data])

    def add_(self, delta: torch.Tensor) -> None:
        """Move the parameters by a flat ``delta``, without a lock (Hogwild)."""
        for d, part in zip(self.data, delta.split(self.numels)):
            d.add_(part.view_as(d))

    def load(self, flat: torch.Tensor | np.ndarray) -> None:
        for d, part in zip(self.data, torch.as_tensor(flat).split(self.numels)):
            d.copy_(part.view_as(d))


class HogwildStep(Mode):
    """One Hogwild thread's step function (each thread has its own, with its own PS client)."""

    def __init__(self, replica: DenseReplica, client: PSClient):
        self.replica, self.client = replica, client

    def step(self, batch: Batch | None):
        if batch is None:
            return STOP
        pulled = self.client.pull(batch.sparse)
        begin = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(
            self.replica.model(batch.dense, pulled.embeddings()), batch.label)
        *grads, pulled.rows.grad = torch.autograd.grad(loss, [*self.replica.params, pulled.rows])
        self.after_compute(time.perf_counter() - begin)
        self.replica.apply(grads)
        self.client.push(pulled)  # rows only: the dense part stays on this trainer
        return loss.item()

    def finish(self) -> None:
        self.client.flush()


class ElasticSync:
    """EASGD against the center c on PS shard 0: d = alpha (w - c), c += d there, w -= d here.
    One call a round (the shard computes d from the replica sent: pulling c and pushing d would
    move the vector three times). Needs no agreement between trainers: each stops when done."""

    def __init__(self, replica: DenseReplica, shard, alpha: float,
                 survive_shard_restarts: bool = False):
        """``survive_shard_restarts`` (partial recovery): a round whose shard died is skipped
        (the shard comes back with its center from its last checkpoint)."""
        self.replica, self.shard, self.alpha = replica, shard, alpha
        self.survive_shard_restarts = survive_shard_restarts
        self.skipped = 0

    def round(self, done: bool) -> bool:
        try:
            d = ray.get(self.shard.easgd_exchange.remote(self.replica.vector().numpy(),
                                                         self.alpha))
        except ray.exceptions.RayActorError:
            if not self.survive_shard_restarts:
                raise
            self.skipped += 1
            return done
        self.replica.add_(-as_tensor(d))
        return done


class AveragingSync:
    """MA (``bmuf`` None) or BMUF: all-reduce the replicas and a done flag on ``group``."""

    def __init__(self, replica: DenseReplica, group, trainers: int, bmuf: BMUF | None = None):
        self.replica, self.group, self.trainers, self.bmuf = replica, group, trainers, bmuf

    def round(self, done: bool) -> bool:
        import torch.distributed as dist
        snapshot = self.replica.vector()
        buf = torch.cat([snapshot, torch.tensor([float(done)])])
        dist.all_reduce(buf, group=self.group)
        mean = mean_of(buf[:-1], self.trainers)
        target = mean if self.bmuf is None else self.bmuf.update(mean)
        self.replica.add_(target - snapshot)  # keeps the Hogwild updates made meanwhile
        return int(buf[-1].item()) == self.trainers
