"""Scenario work in fresh processes (recsync/bench/processes.py): results in order, and no
process left behind when the scenario's process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recsync.bench.processes import map_ordered
from recsync.run.signals import pid_alive

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("processes", [1, 2])
def test_work_in_parallel_comes_back_in_order(processes):
    args = [(2, 3), (3, 2), (5, 1), (7, 0)]
    assert list(map_ordered(pow, args, processes)) == [8, 9, 5, 1]


def _pool_children(pid: int) -> set[int]:
    """The pool's processes that ``pid`` started (not multiprocessing's resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_pools_processes_end_when_the_scenario_is_killed():
    """A scenario killed by SIGKILL (its pool cannot shut down) leaves no simulation running."""
    script = ("import time\nfrom recsync.bench.processes import map_ordered\n"
              "for _ in map_ordered(time.sleep, [(120,), (120,), (120,)], 2): pass\n")
    scenario = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(children := _pool_children(scenario.pid)) < 2:
            assert scenario.poll() is None, "the scenario's process ended by itself"
            assert time.monotonic() < deadline, "the pool's processes did not start"
            time.sleep(0.1)
        os.kill(scenario.pid, signal.SIGKILL)
        scenario.wait()
        deadline = time.monotonic() + 10
        while any(pid_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if pid_alive(c)]
    finally:
        if scenario.poll() is None:
            scenario.kill()
        for c in children | _pool_children(scenario.pid):
            if pid_alive(c):
                os.kill(c, signal.SIGKILL)
