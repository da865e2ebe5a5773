"""A trainer of modes shadow and foreground: Hogwild training threads on one dense replica, and
the rounds that synchronize it with the other trainers' (the synchronizers of
synchronizers.py).

- shadow: a shadow thread runs rounds back to back (starting at least ``min_interval_s``
  apart) while the training threads go on; they never wait for it.
- foreground: the thread whose iteration completes a multiple of ``every`` runs the round
  itself, and the other threads wait at the start of their next step until it is done.

Either way a trainer whose training threads have all finished goes on taking part in rounds,
saying it is done, until a round says every trainer is done (synchronizers.py), and then
stops: no collective is left waiting for it, and no thread is left running. If a training
thread fails, the others stop at their next step and the shadow thread before its next round;
``run`` raises the error (the driver then stops the run and its processes).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Callable


class SyncStats:
    """Rounds made while this trainer was training, and the training iterations between two
    of them (the realised sync gap)."""

    def __init__(self):
        self.rounds = 0  # while training
        self.final_rounds = 0  # after this trainer finished, until every trainer had
        self.round_s = 0.0
        self.gaps: Counter = Counter()
        self._last_iteration = 0

    def add(self, iteration: int, seconds: float, training: bool) -> None:
        self.round_s += seconds
        if not training:
            self.final_rounds += 1
            return
        self.rounds += 1
        self.gaps[iteration - self._last_iteration] += 1
        self._last_iteration = iteration


class HogwildTrainer:
    def __init__(self, steps: list[Callable[[], bool]], sync=None, *, background: bool,
                 every: int = 1, min_interval_s: float = 0.0, paced=contextlib.nullcontext):
        """``steps``: one callable per training thread, doing one step and returning False when
        that thread has no data left; ``sync``: a synchronizer (``round(done) -> all_done``),
        or None for no synchronization at all; ``paced()``: a context that paces a round on
        the worker's emulated cores."""
        self.steps, self.sync, self.paced = steps, sync, paced
        self.background, self.every, self.min_interval_s = background, every, min_interval_s
        self.iterations = 0
        self.stats = SyncStats()
        self.errors: list[BaseException] = []
        self.train_start = self.train_end = None
        self._cond = threading.Condition()
        self._syncing = 0  # foreground rounds under way: the training threads wait
        self._round_lock = threading.Lock()  # one round at a time, in the same order everywhere
        self._abort = threading.Event()
        self._training_done = threading.Event()
        self._threads: list[threading.Thread] = []

    def run(self) -> None:
        """Train until every thread is out of data, then finish the rounds; raises the first
        error of any thread."""
        self.train_start = time.perf_counter()
        self._threads = [threading.Thread(target=self._guard, args=(self._train_loop, step),
                                          daemon=True, name=f"hogwild-{i}")
                         for i, step in enumerate(self.steps)]
        shadow = None
        if self.background and self.sync is not None:
            shadow = threading.Thread(target=self._guard, args=(self._shadow_loop,), daemon=True,
                                      name="shadow")
            self._threads.append(shadow)
        for t in self._threads:
            t.start()
        for t in self._threads:
            if t is not shadow:
                t.join()
        self.train_end = time.perf_counter()
        self._training_done.set()
        if not self.errors:
            if shadow is not None:
                shadow.join()
            elif self.sync is not None:
                self._guard(self._final_rounds)
        if self.errors:
            raise self.errors[0]

    def training_over(self) -> bool:
        """Whether every training thread has finished (its rounds may go on)."""
        return self._training_done.is_set()

    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def train_s(self) -> float:
        end = self.train_end if self.train_end is not None else time.perf_counter()
        return 0.0 if self.train_start is None else end - self.train_start

    # -- threads -------------------------------------------------------------------------
    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to run(), which raises it
            self.errors.append(e)
            self._abort.set()
            with self._cond:
                self._cond.notify_all()

    def _train_loop(self, step: Callable[[], bool]) -> None:
        while not self._abort.is_set():
            with self._cond:  # foreground: wait while a round runs
                self._cond.wait_for(lambda: self._syncing == 0 or self._abort.is_set())
            if not step():
                return
            with self._cond:
                self.iterations += 1
                due = (not self.background and self.sync is not None
                       and self.iterations % self.every == 0)
                if due:
                    self._syncing += 1
            if due:
                try:
                    self._round(done=False, wait=False)
                finally:
                    with self._cond:
                        self._syncing -= 1
                        self._cond.notify_all()

    def _shadow_loop(self) -> None:
        while not self._abort.is_set():
            begin = time.perf_counter()
            if self._round(done=self._training_done.is_set()):
                return
            rest = self.min_interval_s - (time.perf_counter() - begin)
            if rest > 0:
                self._abort.wait(rest)

    def _final_rounds(self) -> None:
        while not self._abort.is_set() and not self._round(done=True):
            pass

    def _round(self, done: bool, wait: bool = True) -> bool:
        """One round (``wait``: for the synchronizer to be ready; else, a foreground round
        while an elastic run pauses the rounds, none: training goes on)."""
        with self._round_lock:
            ready = getattr(self.sync, "ready", None)  # AveragingSync's pause
            if ready is not None and not ready(wait):
                return False
            begin = time.perf_counter()
            with self._cond:
                iteration = self.iterations  # the iterations this round's replica holds
            with self.paced():
                all_done = self.sync.round(done)
            self.stats.add(iteration, time.perf_counter() - begin, training=not done)
            return all_done
