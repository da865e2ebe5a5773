"""mode "async": asynchronous parameter server (DESIGN §6.2).

Each step a worker pulls its batch's rows and the dense parameters, computes, and pushes the
gradients without waiting; the PS applies every push as it arrives (its staleness is recorded).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recsync.data.reader import Batch
from recsync.ps.client import PSClient
from recsync.sync.base import STOP, Mode


class AsyncPS(Mode):
    def __init__(self, model: torch.nn.Module, client: PSClient):
        self.model, self.client = model, client
        self.params = list(model.parameters())

    def step(self, batch: Batch | None):
        if batch is None:
            return STOP
        pulled = self.client.pull(batch.sparse)
        loss, dense_grad = self._compute(batch, pulled)
        self._push(pulled, dense_grad, len(batch))
        return loss

    def _compute(self, batch: Batch, pulled) -> tuple[float, np.ndarray]:
        """Forward and backward on the dense vector last pulled; (loss, flat dense gradient)."""
        with torch.no_grad():
            vector_to_parameters(torch.tensor(self.client.last_dense), self.params)  # a copy
        for p in self.params:
            p.grad = None
        begin = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(self.model(batch.dense, pulled.embeddings()),
                                                  batch.label)
        loss.backward()
        self.after_compute(time.perf_counter() - begin)
        return loss.item(), parameters_to_vector([p.grad for p in self.params]).numpy()

    def _push(self, pulled, dense_grad, samples: int) -> None:
        self.client.push(pulled, dense_grad)

    def finish(self) -> None:
        self.client.flush()
