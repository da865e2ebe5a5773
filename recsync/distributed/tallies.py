"""The run's tallies, free of Ray: each rank's counts (its earlier processes' and its process
now's), the chunks each rank took, the workers restarted, the training rate of recent polls,
and the training clock. The actors (actors.py) report counts here; nothing else writes them."""

from __future__ import annotations

from collections import deque

from recsync.distributed.recovery_math import training_rate
from recsync.distributed.status import counts_of_dead

RATE_WINDOW_POLLS = 20  # the training rate that prices work done again: over the last 10 s


def _zero() -> dict:
    return {"samples": 0, "steps": 0}


class RunTallies:
    """Counts and clock of one run of ``workers`` ranks."""

    def __init__(self, workers: int):
        self.done_before = [_zero() for _ in range(workers)]  # the rank's dead processes'
        self.last = [_zero() for _ in range(workers)]  # its process now's, at the last poll
        self.taken: list[list] = [[] for _ in range(workers)]
        self.restarts = 0  # workers restarted after a death
        self.start_unix = 0.0  # epoch seconds when training starts: fault schedules count from it
        self.clock_started = False  # set when the first workers start training
        self.resumed_unix = 0.0  # when the last rollback had workers going again
        self.recent: deque = deque(maxlen=RATE_WINDOW_POLLS)  # (epoch s, samples) per poll

    # -- counts --------------------------------------------------------------------------
    def polled(self, rank: int, samples: int, steps: int) -> dict:
        """Rank ``rank``'s process now has counted ``samples`` and ``steps``: the rank's
        totals ({samples, steps}, its earlier processes' included)."""
        self.last[rank] = {"samples": samples, "steps": steps}
        before = self.done_before[rank]
        return {"samples": samples + before["samples"], "steps": steps + before["steps"]}

    def dead_counts(self, rank: int, completed: int, batch_size: int) -> dict:
        """Rank ``rank``'s dead process's counts, corrected by the samples of the chunks the
        queue saw the rank complete (``completed``; status.counts_of_dead)."""
        return counts_of_dead(self.last[rank], self.done_before[rank], completed, batch_size)

    def retired(self, rank: int, last: dict) -> None:
        """Rank ``rank``'s process is gone, having counted ``last``: its rank keeps it."""
        self.done_before[rank] = {k: self.done_before[rank][k] + last[k]
                                  for k in ("samples", "steps")}
        self.last[rank] = _zero()

    def took(self, rank: int, chunks: list) -> None:
        """Rank ``rank``'s process took ``chunks`` from the queue."""
        self.taken[rank] += chunks

    def rolled_back(self, done_before: list[dict]) -> None:
        """A rollback: each rank's counts are a job checkpoint's (``done_before``), its
        process's none yet."""
        self.done_before = done_before
        self.last = [_zero() for _ in done_before]

    def count_restarts(self, n: int) -> None:
        self.restarts += n

    # -- clock and rate ------------------------------------------------------------------
    def start_clock(self, train_s_before: float, now: float) -> bool:
        """The first workers start training at ``now`` (epoch s) after ``train_s_before`` s
        of earlier runs: the clock starts (start-up is not training time). False where it had
        started already."""
        if self.clock_started:
            return False
        self.clock_started = True
        self.start_unix = now - train_s_before
        return True

    def provisional_start(self, train_s_before: float, now: float) -> None:
        """Until the clock starts, events count from ``now`` less ``train_s_before``."""
        self.start_unix = now - train_s_before

    def observe(self, now: float, samples: int) -> None:
        """A poll at ``now`` saw ``samples`` done in all."""
        self.recent.append((now, samples))

    def rate_before(self, until_unix: float) -> float:
        """The training rate of the recent polls up to ``until_unix`` (samples/s, 0.0 if
        unknown)."""
        return training_rate(self.recent, until_unix)

    def resumed(self, now: float) -> None:
        """A rollback had the workers going again at ``now``: the rate starts afresh."""
        self.resumed_unix = now
        self.recent.clear()
