"""mode "async": asynchronous parameter server (docs/design.md §6.2).

Each step a worker pulls its batch's rows and the dense parameters, computes, and pushes the
gradients without waiting; the PS applies every push as it arrives (its staleness is recorded).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recsync.cluster.device import host
from recsync.model import loss as model_loss
from recsync.modes.base import JOIN_AS_IS, STOP, Mode, ShardRule, WorkerMode


class AsyncWorker(WorkerMode):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.params = list(ctx.model.parameters())

    def step(self, batch, ahead=None, thread: int = 0):
        if batch is None:
            return STOP
        pulled = self.ctx.client.pull(batch)
        loss, dense_grad = self.compute(batch, pulled)
        self.send(pulled, dense_grad, len(batch))
        return loss

    def compute(self, batch, pulled) -> tuple[float, np.ndarray]:
        """Forward and backward on the dense vector that came with ``pulled``; (loss, flat
        dense gradient). The row gradients stay in ``pulled`` for the push."""
        with torch.no_grad():
            vector_to_parameters(torch.tensor(pulled.dense, device=self.ctx.device),
                                 self.params)  # a copy
        for p in self.params:
            p.grad = None
        self.ctx.before_compute()
        begin = time.perf_counter()
        loss = model_loss.loss(self.ctx.model, batch, pulled.embeddings())
        loss.backward()
        self.ctx.after_compute(time.perf_counter() - begin)
        return loss.item(), host(parameters_to_vector([p.grad for p in self.params]))

    def send(self, pulled, dense_grad: np.ndarray, samples: int) -> None:
        self.ctx.client.push(pulled, dense_grad)


class ApplyNow(ShardRule):
    """Every push is an update of its own, applied as it arrives; its staleness is the version
    now minus the version its worker read (0 if the shard was rolled back since)."""

    def push(self, core, ids, grads, dense_grad, meta: dict) -> int:
        staleness = max(0, core.version - meta["version_read"])
        core.apply_now(ids, grads, dense_grad, meta.get("lr_scale", 1.0),
                       meta.get("dense_lr_scale"))
        core.record_staleness(staleness)
        return staleness


class Async(Mode):
    name = "async"
    joins = JOIN_AS_IS
    gpu_workers = True
    worker = AsyncWorker
    dense_on_ps = True

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        return ApplyNow()
