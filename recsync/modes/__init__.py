"""The sync modes, by name: one module each behind the contract in base.py."""

from recsync.modes.async_ps import Async
from recsync.modes.base import Mode
from recsync.modes.eager import Eager
from recsync.modes.gba import GBA
from recsync.modes.hybrid import Hybrid
from recsync.modes.shadow import Foreground, Shadow
from recsync.modes.sync import Sync

MODES: dict[str, type[Mode]] = {m.name: m for m in (
    Sync,        # all-reduce of dense gradients; the PS applies each global step
    Async,       # the PS applies every gradient as it arrives
    GBA,         # the PS aggregates a global batch of gradients, decays stale ones
    Shadow,      # a dense replica per worker, Hogwild threads, synchronized in the background
    Foreground,  # the same, synchronized every k iterations inside training
    Eager,       # async with the next batch's pull sent early and staleness-aware lr
    Hybrid,      # dense all-reduced every step, embeddings with bounded staleness
)}
