"""mode "hybrid": PERSIA's split (docs/design.md §6.6): the dense parameters synchronous, the
embeddings with bounded staleness.

Every step the workers all-reduce their dense gradients and apply them to their replicas, as in
sync, so the replicas stay identical and the workers step together. Their row gradients go to
the PS as in sync, and a shard applies a step's rows once every worker's part of it arrived
(sample-weighted, in step order), but a worker does not wait for that before its next step:
its pull for step k waits only until every shard has applied step k - 1 - ``max_staleness``.
The embedding rows a step reads may thus lack the last ``max_staleness`` steps' updates, while
the compute of step k overlaps the PS's work on the steps before. With ``max_staleness = 0``
every pull waits for the step before, which is exactly sync.
"""

from __future__ import annotations

from recsync.modes.sync import StepBarrier, Sync, SyncWorker


class HybridWorker(SyncWorker):
    def __init__(self, ctx):
        self.history = ctx.cfg.hybrid.max_staleness + 1  # the replica may be that far ahead
        super().__init__(ctx)

    def min_version(self) -> int:
        return max(0, self.step_index - self.ctx.cfg.hybrid.max_staleness)

    def send(self, pulled, samples: int) -> None:
        """Push without waiting for the step to be applied (the PS client keeps at most
        ``cluster.push_window`` pushes per shard in flight)."""
        self.ctx.client.push(pulled, scale=float(samples), step=self.step_index,
                             samples=samples)


class BoundedBarrier(StepBarrier):
    """Sync's step barrier, taking pushes for steps up to ``max_ahead`` past the next one to
    apply (those of workers that run ahead); steps are still applied in order."""

    def __init__(self, num_workers: int, max_ahead: int):
        super().__init__(num_workers)
        self.max_ahead = max_ahead

    def staleness(self, step: int, meta: dict) -> int:
        """Steps whose rows the contribution's pull did not wait for (an empty push read
        nothing)."""
        return max(0, step - meta["version_read"]) if meta["samples"] else 0

    def check_step(self, core, step: int) -> None:
        if not core.version <= step <= core.version + self.max_ahead:
            raise ValueError(f"hybrid push for step {step}, but the shard is at step "
                             f"{core.version} (at most {self.max_ahead} ahead)")


class Hybrid(Sync):
    name = "hybrid"
    worker = HybridWorker
    switchable = False  # switching is built and tested between sync and gba only

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        return BoundedBarrier(cfg.cluster.workers, cfg.hybrid.max_staleness)

