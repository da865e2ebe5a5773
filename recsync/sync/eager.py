"""mode "eager": decoupled push and pull, and staleness-aware learning rates (DESIGN §6.5).

With ``eager.overlap`` (the default), a step on batch i:

1. waits for batch i's pull, which went out one step earlier;
2. at once sends the pull of batch i+1 (its ids are known: the worker reads a batch ahead), so
   that it travels while batch i is computed;
3. computes batch i;
4. pushes batch i's gradients without waiting for them to be applied (at most
   ``cluster.push_window`` pushes in flight per shard: memory stays flat), so that they travel
   while batch i+1 is computed.

Neither waits for the other: the pull of i+1 does not wait for the push of i, so the parameters
of step i+1 lack the worker's own last update. With ``overlap = false`` a step is the baseline
pull, compute, push, each waited for.

Staleness-aware learning rate: every pull answer carries the version the shard read. When a
worker pushes batch i it knows, per shard, the newest version it has seen (from any answer,
including batch i+1's pull if it has arrived); τ = that version minus the version batch i's
parameters were read at, the updates it knows its gradient missed. The shard applies the update
with its learning rate x m(τ) (``eager.lr_modulation``; default 1 / max(1, τ)), so stale updates
move the global parameters less. τ and the multipliers are counted for the summary.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import torch

from recsync.data.reader import Batch
from recsync.ps.client import PSClient
from recsync.sync.async_ps import AsyncPS
from recsync.sync.base import STOP

MODULATIONS = {
    "none": lambda tau: 1.0,
    "inverse": lambda tau: 1.0 / max(1, tau),
    "inverse_sqrt": lambda tau: 1.0 / math.sqrt(max(1, tau)),
}


def modulation(name: str):
    """m(τ) by name; unknown names raise ValueError listing the valid ones."""
    if name not in MODULATIONS:
        raise ValueError(f"unknown lr modulation {name!r}; valid: {sorted(MODULATIONS)}")
    return MODULATIONS[name]


class EagerPS(AsyncPS):
    """Async's forward and backward (``AsyncPS._compute``) with eager pulls and modulated
    pushes around them."""

    def __init__(self, model: torch.nn.Module, client: PSClient, *, overlap: bool = True,
                 lr_modulation: str = "inverse"):
        super().__init__(model, client)
        self.overlap = overlap
        self.m = modulation(lr_modulation)
        self._next = None  # the pull sent for the next batch
        self.taus: Counter = Counter()  # τ (as the worker knew it) -> updates
        self.multiplier_sum, self.multiplier_min, self.updates = 0.0, 1.0, 0

    def add_waits(self, pull_s: float, push_s: float) -> None:
        """Replaced by the worker: time this step spent waiting for its pull and its push."""

    def step(self, batch: Batch | None, next_batch: Batch | None = None):
        if batch is None:
            return STOP
        begin = time.perf_counter()
        pending, self._next = self._next, None
        pulled = self.client.complete(pending or self.client.pull_async(batch.sparse))
        pull_s = time.perf_counter() - begin
        if self.overlap and next_batch is not None:
            self._next = self.client.pull_async(next_batch.sparse)
        loss, dense_grad = self._compute(batch, pulled)
        scales = self._scales(pulled.versions)
        begin = time.perf_counter()
        self.client.push(pulled, dense_grad, lr_scales=scales)
        if not self.overlap:
            self.client.flush()
        self.add_waits(pull_s, time.perf_counter() - begin)
        return loss

    def _scales(self, read: list[int]) -> list[float]:
        known = self.client.known_versions(self._next)
        scales = []
        for k, r in zip(known, read):
            tau = max(0, k - r)
            scale = self.m(tau)
            self.taus[tau] += 1
            self.multiplier_sum += scale
            self.multiplier_min = min(self.multiplier_min, scale)
            self.updates += 1
            scales.append(scale)
        return scales

    def stats(self) -> dict:
        return {"taus": dict(self.taus), "multiplier_sum": self.multiplier_sum,
                "multiplier_min": self.multiplier_min, "updates": self.updates}

    def finish(self) -> None:
        """Every push applied (no update is lost at the end of a run)."""
        self.client.flush()
