"""mode "sync": synchronous all-reduce (DESIGN §6.1).

Each step every worker computes gradients on its batch; dense gradients are averaged over the
gloo group and applied by each replica's own optimizer (so replicas stay identical), row
gradients go to the PS, which applies the step once every worker's part arrived. A pause
request rides in the same all-reduce, so that every worker pauses after the same step. Both are
weighted by samples: a worker whose batch is smaller, or empty because the data ran out, counts
for what it holds, which makes a step exactly one step on the global batch. When the all-reduced
sample count is 0, every worker stops at the same step.
"""

from __future__ import annotations

import copy
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from recsync.data.reader import Batch
from recsync.ps.client import PSClient
from recsync.sync.base import STOP, Mode


class SyncAllReduce(Mode):
    def __init__(self, model: torch.nn.Module, client: PSClient,
                 dense_optimizer: torch.optim.Optimizer, step_index: int = 0):
        self.model, self.client, self.optimizer = model, client, dense_optimizer
        self.params = list(model.parameters())
        self.step_index = step_index  # = the PS version this worker's next pull must see
        # (step, params, optimizer state) from just before the last optimizer step: if the PS
        # never completes that step (a worker died), a rebuilt group restarts from it
        self.before_step: tuple | None = None
        self.lock = threading.Lock()
        self._pause = False

    def step(self, batch: Batch | None):
        """One global step; returns the local mean loss, None if this worker had no batch, or
        STOP when no worker had one."""
        n = len(batch) if batch is not None else 0
        pulled, loss = None, None
        for p in self.params:
            p.grad = None
        if n:
            pulled = self.client.pull(batch.sparse, min_version=self.step_index)
            begin = time.perf_counter()
            out = self.model(batch.dense, pulled.embeddings())
            loss = F.binary_cross_entropy_with_logits(out, batch.label)
            loss.backward()
            self.after_compute(time.perf_counter() - begin)
            grads = parameters_to_vector([p.grad for p in self.params])
        else:
            grads = torch.zeros(sum(p.numel() for p in self.params))
        # Σ_w n_w·g_w, Σ_w n_w and the pause requests in one collective.
        buf = torch.cat([grads * n, torch.tensor([float(n), float(self.pause_requested())])])
        dist.all_reduce(buf)
        total = buf[-2].item()
        self._pause = buf[-1].item() > 0
        if total == 0:
            return STOP
        offset = 0
        for p in self.params:
            p.grad = (buf[offset:offset + p.numel()] / total).view_as(p).clone()
            offset += p.numel()
        with self.lock:
            self.before_step = (self.step_index, self._params_copy(),
                                copy.deepcopy(self.optimizer.state_dict()))
            self.optimizer.step()
            self.client.push_sync(self.step_index, pulled, n)
            self.step_index += 1
        return None if loss is None else loss.item()

    def agreed_pause(self) -> bool:
        """Whether any worker asked to pause in the last step's all-reduce: then all do."""
        return self._pause

    def _params_copy(self) -> torch.Tensor:
        return parameters_to_vector(self.params).detach().clone()

    def dense_states(self) -> dict[int, dict]:
        """Dense parameters and optimizer state as of the start of each step this replica can
        still tell: the current one and, if any, the one before its last optimizer step."""
        with self.lock:
            states = {self.step_index: {"params": self._params_copy().numpy(),
                                        "optimizer": copy.deepcopy(self.optimizer.state_dict())}}
            if self.before_step is not None:
                states[self.before_step[0]] = {"params": self.before_step[1].numpy(),
                                               "optimizer": self.before_step[2]}
        return states

    def finish(self) -> None:
        self.client.flush()
