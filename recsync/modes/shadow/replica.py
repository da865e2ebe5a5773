"""A trainer's dense replica and one Hogwild thread's step on it (modes shadow and foreground,
ShadowSync: docs/design.md §6.4).

- ``DenseReplica``: the dense parameters one trainer's threads share. Every write (the Hogwild
  threads' optimizer steps, the synchronizer's moves) goes through ``.data`` aliases: an
  in-place write on an autograd leaf bumps its version counter and makes the backward pass that
  another thread is running at that moment fail (docs/design.md §2). Forward and backward run
  without any lock; only the optimizer step itself (a few element-wise ops) is serialized, because a
  torch optimizer reads its gradients from ``.grad`` and keeps one state per parameter.
- ``HogwildStep``: one thread's step: pull the batch's rows from the PS, forward, backward (the
  gradients returned, not accumulated in shared ``.grad``), update the replica, push the row
  gradients (embeddings are trained asynchronously on the PS, as in mode async).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from recsync.model import loss as model_loss
from recsync.model.optim import dense_step
from recsync.modes.base import STOP


class DenseReplica:
    """A trainer's dense parameters, written only through ``.data`` aliases (see above)."""

    def __init__(self, model: torch.nn.Module, optimizer_cls, lr: float,
                 weight_decay: float = 0.0, warmup_steps: int = 0):
        self.model = model
        self.params = list(model.parameters())
        self.data = [p.data for p in self.params]  # same storage, outside autograd
        self.numels = [p.numel() for p in self.params]
        self.optimizer = optimizer_cls(self.data, lr=lr, weight_decay=weight_decay)
        self.warmup_steps = warmup_steps  # counted over all threads' steps
        self._update = threading.Lock()

    def apply(self, grads: list[torch.Tensor]) -> None:
        """One optimizer step with this thread's gradients."""
        with self._update:
            for d, g in zip(self.data, grads):
                d.grad = g
            dense_step(self.optimizer, self.warmup_steps)
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


class HogwildStep:
    """One Hogwild thread's step function (each thread has its own, with its own PS client).
    ``after_compute(compute_s)``: the worker's timer and straggler hook; ``before_compute``:
    the emulated cluster's pacing of the pull."""

    def __init__(self, replica: DenseReplica, client, after_compute, before_compute=None):
        self.replica, self.client, self.after_compute = replica, client, after_compute
        self.before_compute = before_compute or (lambda: None)

    def step(self, batch):
        if batch is None:
            return STOP
        pulled = self.client.pull(batch)
        self.before_compute()
        begin = time.perf_counter()
        loss = model_loss.loss(self.replica.model, batch, pulled.embeddings())
        n = len(self.replica.params)
        grads = torch.autograd.grad(loss, [*self.replica.params, *pulled.leaves])
        grads, row_grads = grads[:n], grads[n:]
        pulled.set_grads(row_grads)
        self.after_compute(time.perf_counter() - begin)
        self.replica.apply(grads)
        self.client.push(pulled)  # rows only: the dense part stays on this trainer
        return loss.item()

    def finish(self) -> None:
        self.client.flush()
