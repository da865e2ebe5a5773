"""mode "gba": global batch gradient aggregation (docs/design.md §6.3, the GBA paper).

The worker's side is async's: pull rows and the dense vector, compute, push without waiting. The
version each shard returned with the pull is the gradient's token; the push carries it and the
batch's sample count, and the shard aggregates gradients until it holds the global batch of sync
(M = workers gradients by default: an elastic run's ``max``, whoever sends them), applies their
sample-weighted mean with the sync optimizer and learning rate, and decays or drops gradients
that are too stale. So the hyper-parameters tuned for sync carry over, while no worker waits for
another.
"""

from __future__ import annotations

from recsync.modes.async_ps import AsyncWorker
from recsync.modes.base import JOIN_AS_IS, Mode, ShardRule
from recsync.ps.aggregation import GradientBuffer, StalenessDecay


class GBAWorker(AsyncWorker):
    def send(self, pulled, dense_grad, samples: int) -> None:
        """Gradients x ``samples`` (the shard divides by the global batch's samples)."""
        self.ctx.client.push(pulled, dense_grad, scale=float(samples), samples=samples)


class GlobalBatch(ShardRule):
    """A buffer of gradients, whatever step they belong to; once it holds ``gradients`` of
    them their sample-weighted mean is applied. A gradient's staleness is the version now minus
    its token (the version read); stale ones are decayed or dropped (``decay``). A token that
    never comes back (its worker died) stalls nothing: the buffer fills with whichever gradients
    arrive."""

    def __init__(self, gradients: int, decay: StalenessDecay):
        self.gradients, self.decay = gradients, decay
        self.buffer = GradientBuffer()
        self.counts = {"applied": 0, "decayed": 0, "dropped": 0, "updates": 0}

    def push(self, core, ids, grads, dense_grad, meta: dict) -> int:
        staleness = max(0, core.version - meta["version_read"])
        weight = self.decay.weight(staleness)
        if weight == 0.0:
            self.counts["dropped"] += 1
            return staleness
        self.counts["applied"] += 1
        self.counts["decayed"] += weight < 1.0
        core.record_staleness(staleness)
        self.buffer.add(ids, grads, dense_grad, meta["samples"], weight)
        if len(self.buffer) >= self.gradients:
            self._apply(core)
        return staleness

    def _apply(self, core) -> None:
        core.apply_mean(self.buffer)
        self.counts["updates"] += 1

    def end(self, core) -> int:
        """Apply the last, partial global batch: no gradient is left unapplied."""
        held = len(self.buffer)
        if held:
            self._apply(core)
        return held

    def buffered(self) -> int:
        return len(self.buffer)

    def snapshot(self):
        return {}, {"counts": dict(self.counts)}

    def restore(self, arrays, meta) -> None:
        self.counts = dict(meta["counts"])
        self.buffer = GradientBuffer()

    def stats(self) -> dict:
        return {"gba": dict(self.counts)}


class GBA(Mode):
    name = "gba"
    joins = JOIN_AS_IS
    gpu_workers = True
    worker = GBAWorker
    dense_on_ps = True
    summary_key = "gba"
    switchable = True

    @classmethod
    def needs_group(cls, cfg) -> bool:
        return cfg.switching.enabled  # a gloo group kept for switching to sync

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        g = cfg.gba
        return GlobalBatch(g.gradients_per_update or cfg.cluster.workers,
                           StalenessDecay(g.staleness_threshold, g.decay))

    @classmethod
    def samples_per_update(cls, cfg) -> int:
        return cfg.train.batch_size * (cfg.gba.gradients_per_update or cfg.cluster.workers)

    @classmethod
    def summary(cls, cfg, workers, shards, waits) -> dict:
        """Gradients applied (decayed ones included), decayed and dropped. Each shard judges
        every gradient it receives on its own (a push reaches every shard), so the totals count
        shard-gradients; ``per_shard`` has each shard's counts."""
        per_shard = [st["gba"] for st in shards]
        return {**{k: sum(c[k] for c in per_shard) for k in ("applied", "decayed", "dropped")},
                "per_shard": per_shard}
