"""What a worker's training loop is fed, shared with the simulator (recsync/simulation): each
step's batch (and the next one, for a mode that reads ahead) from a source of leased chunks'
batches, and how many times slower an emulated straggler runs now."""

from __future__ import annotations

from collections.abc import Callable

from recsync.config import RunConfig


def straggle_factor(cfg: RunConfig, rank: int, elapsed_s: float) -> float:
    """How many times slower this worker must run now (emulated stragglers; 1.0 = normal)."""
    factor = 1.0
    for s in cfg.faults.stragglers:
        if s.worker == rank and s.start_s <= elapsed_s < s.end_s:
            factor = max(factor, s.factor)
    return factor


def step_feed(source, lookahead: bool, max_steps: int, steps: Callable[[], int]):
    """(batch, the batch after it or None, finished) for each step, then (None, None, None)
    for ever: the end of ``source`` (its (batch, finished) pairs), or ``max_steps`` (0: none)
    once ``steps()`` reaches it. ``ahead`` is given where the mode reads ahead (the source then
    takes two slots in turn: the next batch may be the next chunk's)."""

    def take(later: int):  # the batch ``later`` steps on, unless max_steps stops before
        return None if max_steps and steps() + later >= max_steps else next(source, None)

    current = take(0)
    while current is not None:
        ahead = take(1) if lookahead else None
        yield current[0], ahead and ahead[0], current[1]
        current = ahead if lookahead else take(0)
    while True:
        yield None, None, None
