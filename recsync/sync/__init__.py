"""Sync modes: how a worker gets parameters before a step and what it does with gradients.

A mode has ``step(batch | None) -> loss | None | STOP`` and ``finish()``.
"""

from recsync.sync.allreduce import SyncAllReduce
from recsync.sync.async_ps import AsyncPS

SYNC_MODES = {"sync": SyncAllReduce, "async": AsyncPS}
