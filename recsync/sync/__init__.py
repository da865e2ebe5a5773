"""Sync modes: how a worker gets parameters before a step and what it does with gradients.

A mode has ``step(batch | None) -> loss | None | STOP`` and ``finish()``.
"""

from recsync.sync.allreduce import SyncAllReduce
from recsync.sync.async_ps import AsyncPS
from recsync.sync.eager import EagerPS
from recsync.sync.gba import GBA

SYNC_MODES = {
    "sync": SyncAllReduce,  # all-reduce of dense gradients, PS applies each global step
    "async": AsyncPS,       # PS applies every gradient as it arrives
    "gba": GBA,             # PS aggregates a global batch of gradients, decays stale ones
    "eager": EagerPS,       # async, with pulls sent a batch ahead and staleness-aware lr
}
PS_DENSE_MODES = ("async", "gba", "eager")  # dense parameters live on PS shard 0
HOGWILD_MODES = ("shadow", "foreground")  # a dense replica per worker, Hogwild threads on it,
# synchronized in the background (shadow) or every k iterations (foreground): sync/shadow.py
