"""What a run (local or distributed) records while it goes on: counts, evaluations, events,
checkpoint rounds, recoveries, the modes it ran in. The run owns its record and returns it with
its result (on Ctrl-C and RunFailed the exception carries it); the summary (recsync/run/summary.py)
is built from it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RunRecord:
    start: float = field(default_factory=time.perf_counter)  # when the run began (wall_s)
    train_start: float | None = None  # when the first step began (after start-up)
    train_end: float | None = None
    steps: int = 0
    samples: int = 0
    eval_s: float = 0.0  # training paused for evaluations (local: all of each one;
    # distributed: never): excluded from train_s
    eval_total_s: float = 0.0  # every evaluation during training, paused or not
    eval_every: int = 0  # training samples between evaluations
    evals: list[dict] = field(default_factory=list)
    evals_skipped: int = 0  # distributed: evaluations that met a shard or worker going down
    events: list[dict] = field(default_factory=list)  # {time_s, event, ...}, in order
    logged_events: int = 0  # how many of them metrics.jsonl holds
    modes: list[dict] = field(default_factory=list)  # {mode, from_s, to_s, cause}, in order
    waits: dict = field(default_factory=dict)  # modes that report waits: step, compute and
    # wait totals over all workers' steps
    checkpoints: list[dict] = field(default_factory=list)  # {time_s, sequences, blocked_s, ...}
    recoveries: list[dict] = field(default_factory=list)  # {kind, shard, lost_samples, ...}
    interval_decision: dict | None = None  # recovery.mtbf_s: how the interval was chosen
    train_s_before: float = 0.0  # resumed: training time of the run(s) before
    placement: dict | None = None  # each actor's node when training started (cluster/placement.py)
    stopped: dict | None = None  # why training ended, its best validation evaluation
    # (run/selection.py Selection.section): summary.json's ``stopped``
    elastic: dict | None = None  # an elastic run's worker count over time, joins and drains
    # (distributed/elastic.py ElasticWorkers.section): summary.json's ``elastic``

    def elapsed(self) -> float:
        """Seconds since the run began (start-up included)."""
        return time.perf_counter() - self.start

    def time_s(self) -> float:
        """The training clock of metrics.jsonl, evaluations and mode periods: seconds since
        the first step (start-up excluded; evaluations included), plus the training time of
        the run(s) a resumed run goes on from."""
        begin = self.start if self.train_start is None else self.train_start
        return time.perf_counter() - begin + self.train_s_before

    def startup_s(self) -> float | None:
        """From the run's start to its first step: Ray, actors, the model, the data."""
        return None if self.train_start is None else self.train_start - self.start

    def train_s(self) -> float:
        """Time training ran: start-up, final evaluation and evaluations during it excluded."""
        begin = self.start if self.train_start is None else self.train_start
        end = time.perf_counter() if self.train_end is None else self.train_end
        return end - begin - self.eval_s + self.train_s_before

    def event(self, time_s: float, text: str, **extra) -> None:
        self.events.append({"time_s": time_s, "event": text, **extra})

    def unlogged_events(self) -> list[dict]:
        """The events since the last call (for the next metrics record)."""
        new = self.events[self.logged_events:]
        self.logged_events = len(self.events)
        return new

    def stop(self) -> None:
        """Training ended (also on Ctrl-C or a failure)."""
        if self.train_end is None:
            self.train_end = time.perf_counter()
