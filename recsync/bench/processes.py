"""Work of a scenario in fresh processes, one core each, that end with the scenario's process.

``map_ordered`` runs ``fn(*args)`` in spawned processes (no thread or torch state inherited),
each pinned to a core of its own as it starts (a simulation runs on one core). Each asks Linux
to end it when the process that started it dies (``PR_SET_PDEATHSIG``): a scenario stopped by
SIGTERM or SIGKILL, whose pool cannot shut down, would otherwise leave its workers running
their simulations for minutes, taking the cores of whatever runs next."""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def map_ordered(fn, args: list[tuple], processes: int):
    """``fn(*a)`` for each ``a`` of ``args``, in order; with ``processes`` > 1 in as many fresh
    processes at a time."""
    if processes <= 1:
        yield from (fn(*a) for a in args)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Value("i", 0)
    with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_start,
                             initargs=(started, os.getpid())) as pool:
        futures = [pool.submit(fn, *a) for a in args]
        try:
            yield from (f.result() for f in futures)
        finally:  # a failed arm ends the scenario now, not after every arm still queued
            pool.shutdown(cancel_futures=True)


def _start(started, parent: int) -> None:
    """(A pool's process, as it starts:) ends with ``parent``; a core of its own, the next of
    this machine's, so that two simulations do not share one."""
    die_with(parent)
    if hasattr(os, "sched_setaffinity"):
        with started.get_lock():
            k, started.value = started.value, started.value + 1
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[k % len(cores)]})


def die_with(parent: int) -> None:
    """SIGTERM this process when its parent dies (Linux; elsewhere nothing), and now if the
    parent ``parent`` is already gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)
