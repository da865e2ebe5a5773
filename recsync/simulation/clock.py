"""The simulated clock: a discrete-event queue (heapq) and the simulated processes it runs.

Every simulated worker is a thread running the real worker half of its mode (modes/), but only
one thread runs at a time: the clock hands control to a process, and the process hands it back
when it waits (``sleep``: simulated time passes; ``wait``: for a ``Future`` another event
resolves). Between two waits a process runs alone, so the shard cores, the chunk queue and the
clock need no locks, and the order of everything is the order of the events: deterministic,
whatever the real time each piece of arithmetic takes. Events at the same simulated time run in
the order they were scheduled.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
from collections.abc import Callable

THREAD_STACK_BYTES = 16 << 20  # a worker thread runs torch's forward and backward


def _locked() -> threading.Lock:
    """A held lock, used as a binary semaphore between two threads (one releases, the other
    acquires): a C lock, without threading.Semaphore's Condition in Python around it."""
    lock = threading.Lock()
    lock.acquire()
    return lock


@contextlib.contextmanager
def on_one_core():
    """The calling thread, and the threads it starts meanwhile, on one core of those it may use
    (the lowest): only one of them runs at a time, and a hand-over between threads on two cores
    waits for the other core to wake (a lock's round trip between two threads took 56-67 us
    on this 2-core machine, 4.4 us on one core). The thread's cores are restored after."""
    if not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Deadlock(RuntimeError):
    """No event is left but some process still waits (e.g. an all-reduce a worker never
    joins): the simulated run cannot go on."""


class Future:
    """A value some event will provide (a shard's answer, an all-reduce's sum). Processes that
    ``Clock.wait`` for it are resumed when it is resolved."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.done = False
        self.value = None
        self.error: BaseException | None = None
        self._waiters: list[Process] = []
        self._callbacks: list[Callable[[Future], None]] = []

    def resolve(self, value=None, error: BaseException | None = None) -> None:
        assert not self.done, "a future is resolved once"
        self.done, self.value, self.error = True, value, error
        for p in self._waiters:
            self.clock.at(self.clock.now, p.resume)
        self._waiters.clear()
        for fn in self._callbacks:
            fn(self)

    def then(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(self)`` when resolved (at once if it is)."""
        if self.done:
            fn(self)
        else:
            self._callbacks.append(fn)


class Process:
    """A simulated process: ``fn`` on a thread of its own that runs only when the clock hands
    it control."""

    def __init__(self, clock: Clock, fn: Callable[[], None], name: str):
        self.clock, self.fn, self.name = clock, fn, name
        self.finished = False
        self.error: BaseException | None = None
        self._go = _locked()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        self._go.acquire()
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the clock, which raises it
            self.error = e
        finally:
            self.finished = True
            self.clock._handed_back.release()

    def resume(self) -> None:
        """(An event:) run this process until it waits again or ends."""
        clock = self.clock
        clock.current = self
        self._go.release()
        clock._handed_back.acquire()
        clock.current = None
        if self.error is not None:
            raise self.error

    def _pause(self) -> None:
        """(In this process's thread:) hand control back to the clock until resumed."""
        self.clock._handed_back.release()
        self._go.acquire()


class Clock:
    """Simulated time in seconds, its event queue and the processes on it."""

    def __init__(self):
        self.now = 0.0
        self._events: list = []
        self._seq = itertools.count()
        self.processes: list[Process] = []
        self.current: Process | None = None
        self._handed_back = _locked()
        self.events_run = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` (an event) at simulated time ``t`` (not before now)."""
        if t < self.now:
            raise ValueError(f"an event at {t} is in the past (now {self.now})")
        heapq.heappush(self._events, (t, next(self._seq), fn))

    def spawn(self, fn: Callable[[], None], name: str) -> Process:
        """A process that starts at the current time."""
        p = Process(self, fn, name)
        self.processes.append(p)
        before = threading.stack_size()
        threading.stack_size(THREAD_STACK_BYTES)
        try:
            p.thread.start()
        finally:
            threading.stack_size(before)
        self.at(self.now, p.resume)
        return p

    def sleep(self, seconds: float) -> None:
        """(In a process:) let ``seconds`` of simulated time pass."""
        p = self._running()
        self.at(self.now + max(0.0, seconds), p.resume)
        p._pause()

    def wait(self, future: Future):
        """(In a process:) the future's value, once some event resolves it; raises its error."""
        if not future.done:
            p = self._running()
            future._waiters.append(p)
            p._pause()
        if future.error is not None:
            raise future.error
        return future.value

    def advance(self, t: float) -> None:
        """Move the time on to ``t`` without running the events before it (after a run: what
        happens then, e.g. the watch loop's last poll, is not an event of the cluster's)."""
        if t < self.now:
            raise ValueError(f"time {t} is in the past (now {self.now})")
        self.now = t

    def _running(self) -> Process:
        p = self.current
        if p is None or threading.current_thread() is not p.thread:
            raise RuntimeError("only a simulated process can wait on the simulated clock")
        return p

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run events in time order until none is left (or ``until()`` holds after one).
        Raises what a process raised, or Deadlock if processes still wait with nothing left to
        wake them."""
        while self._events:
            t, _, fn = heapq.heappop(self._events)
            self.now = t
            fn()
            self.events_run += 1
            if until is not None and until():
                return
        stuck = [p.name for p in self.processes if not p.finished]
        if stuck:
            raise Deadlock(f"simulated time {self.now:.3f} s: no event left, but "
                           f"{len(stuck)} process(es) wait ({', '.join(stuck[:8])}"
                           f"{', ...' if len(stuck) > 8 else ''})")
