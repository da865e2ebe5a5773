"""Processes a run leaves behind: once Ray has shut down, which of the job's processes still live.

A process counts as left behind (a stray) if, some seconds after the run returned, it is

- one the run's ``RssSampler`` saw during the run (``per_process``: every descendant of the
  driver, and any process naming the driver's Ray session), alive with the same pid and start
  time (a reused pid is another process);
- a descendant of the driver (the benchmark's own process) other than the driver itself;
- or a process whose command line names a Ray session the driver started
  (``/tmp/ray/session_<date>_<driver pid>``; a Ray helper that outlived its raylet is
  re-parented to init, so it is no longer a descendant).

and was not there before the run began (the driver's own helpers, such as a multiprocessing
resource tracker, or what an earlier run of the benchmark left behind, counted there).
Processes of other users' or other drivers' Ray instances match none of these. ``find`` is a
plain function of process lists, so it is tested without real processes; ``StrayCounter`` reads
the machine's with psutil and waits a grace period for processes that are still exiting.
"""

from __future__ import annotations

import os
import re
import time

# isort: off
import ray  # noqa: F401  (first: it puts the psutil it bundles on sys.path)
import psutil
# isort: on

GRACE_S = 10.0  # what still lives this long after the run returned is left behind
START_TIME_TOLERANCE_S = 0.05


def session_pattern(driver_pid: int) -> re.Pattern:
    """A Ray session directory of a driver: Ray names it after the driver's pid."""
    return re.compile(rf"session_[0-9_-]+_{driver_pid}\b")


def descendants(now: dict[int, dict], root_pid: int) -> set[int]:
    """Pids in ``now`` (pid -> {"ppid", ...}) below ``root_pid``."""
    children: dict[int, list[int]] = {}
    for pid, p in now.items():
        children.setdefault(p["ppid"], []).append(pid)
    found, todo = set(), list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        if pid not in found and pid != root_pid:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def same(a: dict, b: dict) -> bool:
    """Whether two records of one pid are the same process (a pid may be reused)."""
    return abs(a["create_time"] - b["create_time"]) <= START_TIME_TOLERANCE_S


def find(seen: dict[int, dict], now: dict[int, dict], driver_pid: int,
         before: dict[int, dict] | None = None) -> list[dict]:
    """The strays among ``now`` (pid -> {"ppid", "create_time", "cmdline"}: the machine's
    processes) for a run whose driver is ``driver_pid`` and whose sampler saw ``seen`` (pid ->
    {"create_time", "role", "cmdline"}); ``before``: the machine's processes (the same
    layout) when the run began. Each stray: {"pid", "create_time", "cmdline", "why"}."""
    before = before or {}
    session = session_pattern(driver_pid)
    below = descendants(now, driver_pid)
    out = []
    for pid, p in sorted(now.items()):
        if pid == driver_pid or (pid in before and same(before[pid], p)):
            continue
        was = seen.get(pid)
        if was is not None and same(was, p):
            why = f"seen during the run ({was['role']})"
        elif pid in below:
            why = "a descendant of the driver"
        elif session.search(p["cmdline"]):
            why = "names the driver's Ray session"
        else:
            continue
        out.append({"pid": pid, "create_time": p["create_time"], "cmdline": p["cmdline"][:160],
                    "why": why})
    return out


def machine_processes() -> dict[int, dict]:
    """Every process on the machine: pid -> {"ppid", "create_time", "cmdline"}."""
    out = {}
    for p in psutil.process_iter(["ppid", "create_time", "cmdline", "name"]):
        info = p.info
        if info["create_time"] is None:
            continue
        out[p.pid] = {"ppid": info["ppid"], "create_time": info["create_time"],
                      "cmdline": " ".join(info["cmdline"] or []) or (info["name"] or "")}
    return out


class StrayCounter:
    """Strays of one run: ``before_run`` when it begins, ``after_run`` once it returned."""

    def __init__(self, driver_pid: int | None = None, grace_s: float = GRACE_S):
        self.driver_pid = driver_pid or os.getpid()
        self.grace_s = grace_s
        self.before: dict[int, dict] = {}

    def before_run(self) -> None:
        self.before = machine_processes()

    def after_run(self, seen: dict[int, dict]) -> dict:
        """Call once the run returned (Ray shut down): waits up to ``grace_s`` for the job's
        processes to exit. Returns {"strays": [...], "waited_s"}."""
        start = time.perf_counter()
        while True:
            strays = find(seen, machine_processes(), self.driver_pid, self.before)
            waited = time.perf_counter() - start
            if not strays or waited >= self.grace_s:
                return {"strays": strays, "waited_s": waited}
            time.sleep(0.5)
