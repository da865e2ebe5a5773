"""``DistributedRun``: one distributed run as its parts, each the one owner of what it knows,
and the few verbs that span more than one:

- ``actors`` (actors.py): the PS shards, the work queue and the workers, and the verbs on them
  (the one part that speaks to Ray);
- ``tallies`` (tallies.py): each rank's counts, restarts, the recent training rate, the clock;
- ``shard_watch`` (shard_watch.py): the shards' processes as the driver saw them, the kills
  not yet recovered, the downtimes still open;
- ``model`` (driver_model.py): the driver's model, tables and plan, and a warm start's files;
- ``rounds`` (checkpoints.py), ``record`` (recsync/run/record.py), ``cfg``, ``ds``.

Nothing here holds state of its own, and nothing here imports Ray: the verbs below are run
with a fake ``actors`` in the unit tests. train.py ``build_run`` makes the real one."""

from __future__ import annotations

import time

from recsync.distributed.status import ShardStatus, WorkerStatus


class DistributedRun:
    """The parts of one run (see the module's docstring)."""

    def __init__(self, cfg, ds, record, model, actors, tallies, shard_watch, rounds):
        self.cfg, self.ds, self.record, self.model = cfg, ds, record, model
        self.actors, self.tallies, self.shard_watch = actors, tallies, shard_watch
        self.rounds = rounds
        self.best = None  # with a validation slice: model selection (best.py; train.py sets it)
        self.elastic = None  # an elastic run's worker count (elastic.py; train.py sets it)

    @property
    def facts(self):
        """The mode now's facts (recsync.modes.base.Mode)."""
        return self.actors.facts

    def start_workers(self, ranks: list[int], dense_state: dict | None = None,
                      step_index: int = 0) -> None:
        """Fresh workers for ``ranks`` (``dense_state``: flat layout), on a new group where
        the mode has one; then they start training (the first ones start the clock)."""
        self.actors.spawn(ranks, dense_state, step_index)
        self.start_placed(ranks)

    def start_placed(self, ranks: list[int], dense_state: dict | None = None,
                     step_index: int = 0) -> None:
        """Workers built apart (an elastic run's, actors.spawn_later) start training
        (``dense_state``: a live replica's, for a mode whose joins start from one, at global
        step ``step_index``)."""
        self.shard_watch.workers_started(ranks)
        if self.tallies.start_clock(self.record.train_s_before, time.time()):
            self.record.train_start = time.perf_counter()  # start-up is not training time
            self.actors.measure_idle()
        self.actors.start(ranks, self.tallies.start_unix, dense_state, step_index)

    def poll(self) -> list[WorkerStatus]:
        """Every worker's status, with its rank's counts (actors.poll)."""
        return self.actors.poll(self.tallies)

    def retire(self, ranks: list[int]) -> None:
        """The workers' counts kept by their ranks, their chunks requeued (actors.retire)."""
        self.actors.retire(ranks, self.tallies)

    def restart(self, ranks: list[int], dense_state: dict | None = None,
                step_index: int = 0) -> None:
        self.retire(ranks)
        self.start_workers(ranks, dense_state, step_index)

    def pause_all(self, why: str) -> bool:
        """Every worker paused after a step, or False (actors.pause_all)."""
        return self.actors.pause_all(why, self.shard_watch)

    def shard_statuses(self, patience_s: float | None = None) -> list[ShardStatus]:
        """Every shard's status (actors.shard_statuses)."""
        return self.actors.shard_statuses(self.shard_watch, patience_s)

    # -- fault injection (faults.py) ----------------------------------------------------------
    def kill(self, target: str, index: int) -> None:
        """The worker, PS shard or waiting standby ``index`` exits at once."""
        self.shard_watch.killed(target, index, time.time())
        self.actors.kill(target, index)

    def kill_in_next_write(self, index: int) -> None:
        self.actors.kill_in_next_write(index)

    def is_down(self, target: str, index: int) -> bool:
        """Whether ``index`` has no process to kill now: killed and not back, or (an elastic
        run's worker rank) vacant or not built."""
        if target == "worker" and self.elastic is not None and index not in self.actors.live():
            return True
        return self.shard_watch.is_down(target, index)
