"""The rounds of modes shadow and foreground on the simulated clock (ShadowSync; the real
trainer: modes/shadow/hogwild.py). Each trainer has one training thread (its SimWorker) and
the synchronizer of its mode, built by the mode itself: MA and BMUF all-reduce over the
simulator's group (SimGroup), EASGD exchanges with shard 0's center copy through a simulated
shard call (SimShard.call). The rounds run as the real trainer runs them:

- shadow: a process of its own per trainer (the shadow thread), rounds back to back, each
  starting at least ``shadow.min_interval_s`` after the one before began. It runs on a core of
  its own: its rounds take no time from training. A round that took no simulated time (a free
  network, one trainer) is followed by the next only after a training step of the trainer:
  else simulated time would never move on;
- foreground: the trainer runs a round itself after every ``shadow.foreground_every``-th
  step, and trains on once it is done.

A trainer whose training is over goes on taking part in rounds, saying so, until a round says
that every trainer is (EASGD: its own next round), as the real one does. A round costs its
communication in simulated time (the group's ring all-reduce; the exchange's messages and shard
0's service of a call), not its local arithmetic (a copy and a mean of the dense vector).
"""

from __future__ import annotations

from recsync.modes.shadow.hogwild import SyncStats
from recsync.simulation.clock import Future


class SimRounds:
    """One trainer's rounds. It takes the place of the real trainer (``mode.trainer``), so
    the mode's ``stats()`` reads them as it reads a run's."""

    def __init__(self, worker, group):
        """``worker``: the trainer's SimWorker (its ``mode`` a ShadowWorker); ``group``: the
        simulator's SimGroup (MA, BMUF) or None."""
        mode = worker.mode
        self.worker, self.clock = worker, worker.clock
        self.background = mode.background
        sh = worker.cfg.shadow
        self.every, self.min_interval_s = sh.foreground_every, sh.min_interval_s
        self.sync = mode.make_synchronizer(sim_group=group, get=worker.clock.wait)
        self.stats = SyncStats()
        self.iterations = 0
        self.started_s = worker.clock.now
        self.ended = self.sync is None  # every round of this trainer is over
        self._stepped: Future | None = None  # what a shadow loop waits for after a free round
        mode.trainer = self

    # -- in the trainer's process ------------------------------------------------------------
    def stepped(self) -> None:
        """After one of the trainer's training steps: foreground rounds fall due."""
        self.iterations += 1
        self._wake()
        if not self.background and self.sync is not None and self.iterations % self.every == 0:
            self._round(done=False)

    def final_rounds(self) -> None:
        """After training: (foreground) rounds, saying so, until every trainer is done."""
        self._wake()
        if self.background or self.sync is None:
            return
        while not self._round(done=True):
            pass

    # -- the shadow thread's process -----------------------------------------------------------
    def shadow_loop(self) -> None:
        while True:
            begin = self.clock.now
            if self._round(done=self.training_over()):
                return
            rest = self.min_interval_s - (self.clock.now - begin)
            if rest > 0:
                self.clock.sleep(rest)
            elif self.clock.now == begin and not self.training_over():
                self._stepped = Future(self.clock)
                self.clock.wait(self._stepped)

    def _wake(self) -> None:
        if self._stepped is not None:
            waiting, self._stepped = self._stepped, None
            waiting.resolve()

    def _round(self, done: bool) -> bool:
        begin, iteration = self.clock.now, self.iterations
        all_done = self.sync.round(done)
        self.stats.add(iteration, self.clock.now - begin, training=not done)
        self.ended = all_done
        return all_done

    # -- what the mode's stats() reads (HogwildTrainer's) -------------------------------------
    def training_over(self) -> bool:
        return self.worker.finished_at is not None

    def train_s(self) -> float:
        end = self.worker.finished_at
        return (self.clock.now if end is None else end) - self.started_s

    def threads_alive(self) -> int:
        return int(not self.ended)  # the run ends once every trainer's rounds have
