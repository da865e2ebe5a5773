"""mode "gba": global batch gradient aggregation (DESIGN §6.3, the GBA paper).

The worker's side is async's: pull rows and the dense vector, compute, push without waiting. The
version each shard returned with the pull is the gradient's token; the push carries it and the
batch's sample count, and the shard (ShardCore.push_gba) aggregates gradients until it holds the
global batch of sync (M = workers gradients by default), applies their sample-weighted mean with
the sync optimizer and learning rate, and decays or drops gradients that are too stale. So the
hyper-parameters tuned for sync carry over, while no worker waits for another.
"""

from __future__ import annotations

from recsync.sync.async_ps import AsyncPS


class GBA(AsyncPS):
    def _push(self, pulled, dense_grad, samples: int) -> None:
        self.client.push_gba(pulled, dense_grad, samples)
