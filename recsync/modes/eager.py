"""mode "eager": decoupled push and pull, and staleness-aware learning rates (docs/design.md
§6.5).

With ``eager.overlap`` (the default), a step on batch i:

1. waits for batch i's pull, which went out one step earlier;
2. at once sends the pull of batch i+1 (its ids are known: the worker reads a batch ahead), so
   that it travels while batch i is computed;
3. computes batch i;
4. pushes batch i's gradients without waiting for them to be applied (at most
   ``cluster.push_window`` pushes in flight per shard: memory stays flat), so that they travel
   while batch i+1 is computed.

Neither waits for the other: the pull of i+1 does not wait for the push of i, so the parameters
it reads lack the worker's own last update. Left so (``eager.own_update = "none"``), every
update is one update staler than async's, which cost 0.055-0.067 eval AUC at the defaults
(docs/benchmarks/2026-11-26-eager-gap.md). So the dense parameters of step i+1 get that update
all the same: by default ("wait") the early pull carries the rows only, and the dense vector
comes back with the push's answer, as the push left it (each step waits for one push's round
trip); "local" has the early pull bring the dense optimizer's state as read, and the worker
applies its own pushed gradient to the pulled vector with that optimizer, as the shard will,
without waiting (the other workers' updates meanwhile are missed). The rows are left as read
(a batch's rows are few of a table's, and the modulation below covers them). With
``overlap = false`` a step is the baseline pull, compute, push, each waited for.

Staleness-aware learning rate: every pull answer carries the version the shard read. When a
worker pushes batch i it knows, per shard, the newest version it has seen (from any answer,
including batch i+1's pull if it has arrived); τ = that version minus the version batch i's
parameters were read at, the updates it knows its gradient missed. The shard applies the update
with its learning rate x m(τ) (``eager.lr_modulation``; default 1 / max(1, τ)), so stale updates
move the global parameters less. τ and the multipliers are counted for the summary.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import torch

from recsync.metrics.stats import distribution, merged_counts
from recsync.modes.async_ps import ApplyNow, AsyncWorker
from recsync.modes.base import JOIN_AS_IS, STOP, Mode
from recsync.ps.core import DenseState

# what of the dense parameters the early pull brings, per ``eager.own_update``
EARLY_DENSE = {"local": "with_state", "wait": "none", "none": "vector"}
# the measured shortfall of each setting but the default (docs/benchmarks/2026-11-26-eager-gap.md)
CAVEATS = {
    "none": ("with eager.own_update = \"none\" each step computes on dense parameters without "
             "its own last update: measured 0.055 eval AUC below async (0.7438 against 0.7992; "
             "800,000 synthetic rows, 2 workers x 2 shards, one seed: "
             "docs/benchmarks/2026-11-26-eager-gap.md); the default \"wait\" was level with it"),
    "local": ("with eager.own_update = \"local\" each step's dense parameters miss the other "
              "workers' updates since its pull: measured 0.011 eval AUC below sync in `recsync "
              "bench modes` (0.7908 against 0.8018, 2 rounds of one seed; 0.003 below async "
              "over 3 seeds: docs/benchmarks/2026-11-26-eager-gap.md); the default \"wait\" "
              "was level with async"),
}

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


class EagerWorker(AsyncWorker):
    """Async's forward and backward (``AsyncWorker.compute``) with eager pulls and modulated
    pushes around them."""

    lookahead = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.overlap = ctx.cfg.eager.overlap
        self.m = modulation(ctx.cfg.eager.lr_modulation)
        self.own_update = ctx.cfg.eager.own_update
        self._next = None  # the pull sent for the next batch
        self._own = None  # (dense gradient, lr multiplier) of the last push, if the next lacks it
        self._mirror = None  # "local": the dense optimizer, as the shard has it
        self.taus: Counter = Counter()  # τ (as the worker knew it) -> updates
        self.dense_taus: Counter = Counter()  # the same for the dense vector
        self.multiplier_sum, self.multiplier_min, self.updates = 0.0, 1.0, 0

    def step(self, batch, ahead=None, thread: int = 0):
        if batch is None:
            return STOP
        client = self.ctx.client
        begin = self.ctx.now()
        pending, self._next = self._next, None
        pulled = client.complete(pending or client.pull_async(batch))
        own, self._own = self._own, None
        dense_read = pulled.versions[client.dense_shard]  # the version its dense vector holds
        if own is not None and pending is not None:  # read before this worker's last push
            pulled.dense, dense_read = self._with_own_update(pulled, *own)
        pull_s = self.ctx.now() - begin
        if self.overlap and ahead is not None:
            self._next = client.pull_async(ahead, dense=EARLY_DENSE[self.own_update])
        loss, dense_grad = self.compute(batch, pulled)
        scales, dense_scale = self._scales(pulled.versions, dense_read)
        begin = self.ctx.now()
        if self.overlap and self.own_update != "none":
            self._own = (dense_grad, dense_scale)
        client.push(pulled, dense_grad, lr_scales=scales, dense_lr_scale=dense_scale,
                    read_dense=self.overlap and self.own_update == "wait")
        if not self.overlap:
            client.flush()
        self.ctx.add_waits(pull_s, self.ctx.now() - begin)
        return loss

    def _with_own_update(self, pulled, grad: np.ndarray, lr_scale: float
                         ) -> tuple[np.ndarray, int]:
        """The pulled dense vector with this worker's last update in it (``eager.own_update``),
        and the version it counts as read at: from the push's answer ("wait": the shard's
        version then), or applied here as the shard applies it ("local": its optimizer, loaded
        with the state the pull read, steps on the pushed gradient x the same multiplier; the
        pull's version + 1)."""
        if self.own_update == "wait":
            return self.ctx.client.dense_after_push()
        t = self.ctx.cfg.train
        if self._mirror is None:
            self._mirror = DenseState(torch.tensor(pulled.dense), t.dense_optimizer,
                                      t.dense_lr, t.dense_weight_decay, t.dense_warmup_steps)
        mirror = self._mirror
        with torch.no_grad():
            mirror.params.copy_(torch.tensor(pulled.dense))  # Ray's arrays are read-only
        mirror.optimizer.load_state_dict(pulled.dense_optimizer)
        mirror.apply(torch.from_numpy(np.asarray(grad, np.float32)), lr_scale)
        version = pulled.versions[self.ctx.client.dense_shard] + 1
        return mirror.params.detach().numpy().copy(), version

    def _scales(self, read: list[int], dense_read: int) -> tuple[list[float], float]:
        """m(τ) per shard for the rows (τ: the newest version known minus the one read), and
        for the dense part, whose vector may hold a later version (``dense_read``)."""
        known = self.ctx.client.known_versions(self._next)
        dense_tau = max(0, known[self.ctx.client.dense_shard] - dense_read)
        self.dense_taus[dense_tau] += 1
        scales = []
        for k, r in zip(known, read):
            tau = max(0, k - r)
            scale = self.m(tau)
            self.taus[tau] += 1
            self.multiplier_sum += scale
            self.multiplier_min = min(self.multiplier_min, scale)
            self.updates += 1
            scales.append(scale)
        return scales, self.m(dense_tau)

    def stats(self) -> dict:
        """τ as this worker knew it, and the learning-rate multipliers applied."""
        return {"taus": dict(self.taus), "dense_taus": dict(self.dense_taus),
                "multiplier_sum": self.multiplier_sum,
                "multiplier_min": self.multiplier_min, "updates": self.updates}


class Eager(Mode):
    name = "eager"
    joins = JOIN_AS_IS
    gpu_workers = True
    worker = EagerWorker
    dense_on_ps = True
    reports_waits = True
    summary_key = "eager"

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        return ApplyNow()  # with each push's lr_scale

    @classmethod
    def caveat(cls, cfg) -> str | None:
        if not cfg.eager.overlap or cfg.eager.own_update == "wait":
            return None
        return CAVEATS[cfg.eager.own_update]

    @classmethod
    def console_line(cls, eager: dict) -> str | None:
        if not eager["iteration_s"]:
            return None
        it, tau = eager["iteration_s"], eager["tau"]
        return (f"step {it['step']:.3f} s: compute {it['compute']:.3f}, waiting for pull "
                f"{it['pull_wait']:.3f}, for push {it['push_wait']:.3f}; staleness known "
                f"to workers: mean {tau['mean']:.2f}, max {tau['max']}; lr x "
                f"{eager['multiplier']['mean']:.3f} on average")

    @classmethod
    def summary(cls, cfg, workers, shards, waits) -> dict | None:
        """The staleness τ each update's worker knew of, the learning-rate multipliers m(τ)
        applied, and where a step's time went (means per step over all workers' steps)."""
        if not workers:
            return None
        taus = merged_counts(w["taus"] for w in workers)
        updates = sum(w["updates"] for w in workers)
        steps = waits.get("interval_steps", 0)
        return {
            "overlap": cfg.eager.overlap, "own_update": cfg.eager.own_update,
            "lr_modulation": cfg.eager.lr_modulation,
            "caveat": cls.caveat(cfg),
            "tau": distribution(taus),
            "dense_tau": distribution(merged_counts(w.get("dense_taus", {}) for w in workers)),
            "multiplier": {"mean": sum(w["multiplier_sum"] for w in workers) / updates
                           if updates else None,
                           "min": min(w["multiplier_min"] for w in workers) if updates else None,
                           "updates": updates},
            "iteration_s": {k.removesuffix("_s"): waits[k] / steps
                            for k in ("step_s", "compute_s", "pull_wait_s", "push_wait_s")}
                           if steps else None,
        }
