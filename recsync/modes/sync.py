"""mode "sync": synchronous all-reduce (docs/design.md §6.1).

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
from collections import Counter, deque

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recsync.cluster.device import host, on_host
from recsync.model import loss as model_loss
from recsync.model.optim import dense_step, make_dense_optimizer
from recsync.modes.base import JOIN_REGROUP, REBUILD_GROUP, STOP, Mode, ShardRule, WorkerMode
from recsync.modes.handover import from_flat, to_flat
from recsync.ps.aggregation import GradientBuffer


class SyncWorker(WorkerMode):
    history = 1  # steps back that ``recovery_states`` can tell (the one before the last)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.model = ctx.model
        self.params = list(ctx.model.parameters())
        t = ctx.cfg.train
        self.optimizer = make_dense_optimizer(t.dense_optimizer, self.params, t.dense_lr,
                                              t.dense_weight_decay)
        self.warmup_steps = t.dense_warmup_steps
        if ctx.dense_state is not None:
            self._load(ctx.dense_state)
        self.step_index = ctx.step_index  # the global step this worker computes next
        # (step, params, optimizer state) from just before the last optimizer steps: if the
        # PS never completes such a step (a worker died), a rebuilt group restarts from it
        self.before: deque = deque(maxlen=self.history)
        self.lock = threading.Lock()
        self._pause = False

    def _load(self, state: dict) -> None:
        with torch.no_grad():
            vector_to_parameters(torch.tensor(state["params"], device=self.ctx.device),
                                 self.params)  # a copy
        if state.get("optimizer") is not None:
            self.optimizer.load_state_dict(from_flat(state["optimizer"],
                                                     [p.shape for p in self.params]))

    def min_version(self) -> int:
        """The PS version a pull for step ``step_index`` waits for: every earlier step."""
        return self.step_index

    def step(self, batch, ahead=None, thread: int = 0):
        """One global step; returns the local mean loss, None if this worker had no batch, or
        STOP when no worker had one."""
        n = len(batch) if batch is not None else 0
        pulled, loss = None, None
        for p in self.params:
            p.grad = None
        if n:
            pulled = self.ctx.client.pull(batch, min_version=self.min_version())
            self.ctx.before_compute()
            begin = time.perf_counter()
            loss = model_loss.loss(self.model, batch, pulled.embeddings())
            loss.backward()
            self.ctx.after_compute(time.perf_counter() - begin)
            grads = parameters_to_vector([p.grad for p in self.params])
        else:
            grads = torch.zeros(sum(p.numel() for p in self.params), device=self.ctx.device)
        # Σ_w n_w·g_w, Σ_w n_w and the pause requests in one collective.
        buf = torch.cat([grads * n, torch.tensor([float(n), float(self.ctx.pause_requested())],
                                                 device=self.ctx.device)])
        (self.ctx.all_reduce or dist.all_reduce)(buf)
        total = buf[-2].item()
        self._pause = buf[-1].item() > 0
        if total == 0:
            return STOP
        offset = 0
        for p in self.params:
            p.grad = (buf[offset:offset + p.numel()] / total).view_as(p).clone()
            offset += p.numel()
        with self.lock:
            self.before.append((self.step_index, self._raw_state()))
            dense_step(self.optimizer, self.warmup_steps)
            self.send(pulled, n)
            self.step_index += 1
        return None if loss is None else loss.item()

    def send(self, pulled, samples: int) -> None:
        """This worker's row gradients x ``samples`` for step ``step_index`` (nothing, 0
        samples, without a batch: every shard counts all workers). Waits for the previous
        step's pushes first (bounded memory, and a failed shard surfaces here)."""
        self.ctx.client.flush()
        self.ctx.client.push(pulled, scale=float(samples), step=self.step_index,
                             samples=samples)

    def agreed_pause(self) -> bool:
        """Whether any worker asked to pause in the last step's all-reduce: then all do."""
        return self._pause

    def _raw_state(self) -> tuple:
        """Copies of the parameters and the optimizer state now (cheap: the step's hot path)."""
        return (parameters_to_vector(self.params).detach().clone(),
                copy.deepcopy(self.optimizer.state_dict()))

    def _flat(self, raw: tuple) -> dict:
        """A raw state in the flat layout every dense state crossing processes has."""
        return {"params": host(raw[0]),  # host memory: the driver has no GPU
                "optimizer": to_flat(on_host(raw[1]), [p.shape for p in self.params])}

    def dense_state(self) -> dict:
        with self.lock:
            return self._flat(self._raw_state())

    def recovery_states(self) -> dict[int, dict]:
        """Dense state as of the start of each step this replica can still tell: the current
        one and the ``history`` before it."""
        with self.lock:
            raw = {**dict(self.before), self.step_index: self._raw_state()}
        return {step: self._flat(r) for step, r in raw.items()}


class StepBarrier(ShardRule):
    """The pushes of one step are summed (each worker pushes gradient x its sample count) and
    applied once all ``num_workers`` have arrived, divided by the total samples: the gradient
    of the mean loss over the global batch, whatever the split of samples between workers. The
    version then equals the number of completed steps."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self.pending: dict = {}  # step -> (GradientBuffer, Counter of staleness)

    def check_step(self, core, step: int) -> None:
        if step != core.version:
            raise ValueError(f"sync push for step {step}, but the shard is at step "
                             f"{core.version}")

    def staleness(self, step: int, meta: dict) -> int:
        """The updates a contribution's rows missed: none in sync, whose pulls wait for every
        step before."""
        return 0

    def push(self, core, ids, grads, dense_grad, meta: dict) -> bool:
        """Add one worker's contribution (grads already x its samples) to its step; apply
        every step that is complete, in order. Returns whether a step was applied."""
        step = meta["step"]
        self.check_step(core, step)  # before queueing: a bad push must not poison the step
        if step not in self.pending:
            self.pending[step] = (GradientBuffer(), Counter())
        buffer, stale = self.pending[step]
        buffer.add(ids, grads, dense_grad, meta["samples"])
        stale[self.staleness(step, meta)] += 1
        applied = False
        while core.version in self.pending and (len(self.pending[core.version][0])
                                                >= self.num_workers):
            buffer, stale = self.pending.pop(core.version)
            for staleness, n in stale.items():
                core.record_staleness(staleness, n)
            core.apply_mean(buffer)
            applied = True
        return applied

    def resize(self, core, num_workers: int) -> None:
        """An elastic run's group changed its size while every worker was paused, its pushes
        applied: each step from now on waits for ``num_workers`` pushes."""
        if self.pending:
            raise RuntimeError(f"the group changes size with steps {sorted(self.pending)} "
                               f"incomplete")
        self.num_workers = num_workers

    def drop_incomplete(self, core) -> int:
        """Forget the contributions to steps that will never complete (a worker died before
        pushing them; the group is rebuilt and redoes them). Returns how many."""
        dropped = self.buffered()
        self.pending.clear()
        return dropped

    def buffered(self) -> int:
        return sum(len(buffer) for buffer, _ in self.pending.values())

    def restore(self, arrays, meta) -> None:
        self.pending.clear()


class Sync(Mode):
    name = "sync"
    gpu_workers = True
    worker = SyncWorker
    lockstep = True
    pauses_for_checkpoint = True
    worker_death = REBUILD_GROUP
    switchable = True
    joins = JOIN_REGROUP

    @classmethod
    def needs_group(cls, cfg) -> bool:
        return True

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        return StepBarrier(cfg.cluster.workers)
