"""The mode controller: when to switch between sync and gba (docs/design.md §6.3), from each
worker's compute time per step. Plain Python, tested without Ray.

Compute time is forward plus backward (and an emulated straggler's delay), never the waiting for
a pull or an all-reduce: in sync every worker waits for the slowest, so step times are all
alike, while compute times still tell the straggler from the others.
"""

from __future__ import annotations

import statistics
from collections import deque

from recsync.config import SwitchingConfig

SMOOTH_S = 2.0  # compute time per step is summed over this many seconds of polls


class ModeController:
    """``observe`` once per poll; returns (mode to switch to, cause) when a switch is due."""

    def __init__(self, cfg: SwitchingConfig):
        self.cfg = cfg
        self._polls: deque = deque()  # (time_s, compute_s per worker, steps per worker)
        self._since: float | None = None  # when the condition for a switch began to hold

    def reset(self) -> None:
        """Forget what was seen (after a switch: the pause is no evidence either way)."""
        self._polls.clear()
        self._since = None

    def ratio(self) -> tuple[float, int] | None:
        """Slowest / median compute time per step over the last SMOOTH_S, and the slowest
        worker; None while fewer than two workers have computed a step."""
        workers = len(self._polls[0][1]) if self._polls else 0
        per_step = {}
        for w in range(workers):
            steps = sum(p[2][w] for p in self._polls)
            if steps:
                per_step[w] = sum(p[1][w] for p in self._polls) / steps
        median = statistics.median(per_step.values()) if len(per_step) >= 2 else 0.0
        if median <= 0:
            return None
        slowest = max(per_step, key=per_step.get)
        return per_step[slowest] / median, slowest

    def observe(self, now_s: float, mode: str, compute_s: list[float],
                steps: list[int]) -> tuple[str, str] | None:
        """``compute_s`` and ``steps``: per worker, since the previous poll."""
        self._polls.append((now_s, compute_s, steps))
        while self._polls and self._polls[0][0] < now_s - SMOOTH_S:
            self._polls.popleft()
        seen = self.ratio()
        if seen is None:
            return None
        ratio, slowest = seen
        want = "gba" if ratio > self.cfg.ratio else "sync"
        if want == mode:
            self._since = None
            return None
        if self._since is None:
            self._since = now_s
        if now_s - self._since < self.cfg.window_s:
            return None
        self.reset()
        if want == "gba":
            return want, (f"auto: worker {slowest}'s compute time per step was {ratio:.2f}x the "
                          f"median (over {self.cfg.ratio:g}) for {self.cfg.window_s:g} s")
        return want, (f"auto: the slowest worker's compute time per step was {ratio:.2f}x the "
                      f"median (under {self.cfg.ratio:g}) for {self.cfg.window_s:g} s")
