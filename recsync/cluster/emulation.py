"""The EMULATED cluster (``[emulation]``): workers and PS shards on one machine that behave like
separate machines with a given number of cores each.

Every process here shares the machine's cores, so a process that sleeps (an emulated straggler)
gives its CPU to the others, and a busy one takes theirs. Pacing removes that coupling: a worker
given q cores makes each training step last at least its CPU time / q (times an emulated
straggler's factor), and a shard given r cores serves its requests one after another, each
taking at least its CPU time / r. As long as the emulated cores add up to less than the
machine has (the config refuses more), every process gets the CPU it needs when it needs it, and
its speed is set by its own emulated cores alone, as on a machine of its own.

CPU time is the whole process's (``time.process_time``), charged to the section that ends next:
a step's or a request's own work and what Ray's threads did for it (serializing its arguments
and answers, gloo). Pacing on the calling thread's CPU time alone left out about 20% of a
worker's CPU time and half of a shard's (measured: docs/design.md §6b).

Less the process's idle CPU: Ray's threads use CPU while a process does nothing (0.03-0.08 of a
core measured in an idle shard), a fixed cost of a process, not a share of its machine; on an
emulated machine of 0.11 cores it was charged to the next request and took most of the shard's
time. Each process measures it before training (``measure_idle``: ``IDLE_WINDOW_S`` doing
nothing) and its machine charges a section only the CPU above that rate since the last section
ended.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

IDLE_WINDOW_S = 1.0  # how long a process measures its idle CPU before training
IDLE_SHARE_MAX = 0.5  # at most this share of a machine's cores is taken as idle CPU


def cluster_label(workers: int, cores_per_worker: float, shards: int,
                  cores_per_shard: float, cores_per_shadow: float = 0.0) -> str:
    shadow = (f" (+ {cores_per_shadow:g} for the shadow thread)" if cores_per_shadow > 0
              else "")
    return (f"EMULATED cluster: {workers} workers x {cores_per_worker:g} cores{shadow}, "
            f"{shards} shards x {cores_per_shard:g} cores")


def label_of(cfg) -> str | None:
    """The run's EMULATED label, or None without emulation."""
    e = cfg.emulation
    if not e.enabled or not cfg.distributed:
        return None
    return cluster_label(cfg.cluster.workers, e.cores_per_worker, cfg.cluster.ps_shards,
                         e.cores_per_shard, shadow_cores(cfg))


def shadow_cores(cfg) -> float:
    """The cores of a trainer's shadow thread of its own (a mode with one), else 0: its
    rounds share the trainer's cores."""
    if not cfg.distributed or not cfg.emulation.cores_per_shadow:
        return 0.0
    from recsync.modes import MODES
    return cfg.emulation.cores_per_shadow if MODES[cfg.mode].shadow_thread else 0.0


class EmulatedMachine:
    """A machine with ``cores`` cores that runs sections of work one after another, on a virtual
    clock: a section that started at t0 ends at max(t0, the end of the previous section) +
    factor x c / cores, c being the CPU time the process used since the previous section ended
    (every thread's: the section's own work, and what Ray's threads did for it). The caller
    waits until then (``close`` returns the wait). Thread-safe: a worker's training threads and
    its shadow thread share their machine's cores this way."""

    def __init__(self, cores: float, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time):
        if cores <= 0:
            raise ValueError(f"cores must be > 0, got {cores}")
        self.cores, self.clock, self.cpu_clock = cores, clock, cpu_clock
        self.free_at = float("-inf")
        self.charged: float | None = None  # the CPU clock up to which sections have paid
        self.charged_at = 0.0  # the wall clock then
        self.idle_cores = self.idle_measured = 0.0  # the process's CPU while idle, in cores
        self.sections = 0
        self.cpu_s = self.service_s = self.late_s = self.idle_cpu_s = 0.0
        self._lock = threading.Lock()

    def set_idle(self, measured_cores: float) -> None:
        """The process's CPU while idle (cores), from ``measure_idle``: not charged to sections
        from now on (at most ``IDLE_SHARE_MAX`` of the machine's cores)."""
        with self._lock:
            self.idle_measured = max(0.0, measured_cores)
            self.idle_cores = min(self.idle_measured, IDLE_SHARE_MAX * self.cores)

    def open(self) -> float:
        """A section starting now (its wall clock)."""
        with self._lock:
            if self.charged is None:
                self.charged, self.charged_at = self.cpu_clock(), self.clock()
        return self.clock()

    def close(self, t0: float, factor: float = 1.0) -> tuple[float, float]:
        """End the section opened at ``t0``: (seconds to wait until it is due, CPU seconds it
        was charged). The wait is 0 if the work took longer than the emulated cores would
        (counted in ``late_s``)."""
        with self._lock:
            now, cpu_now = self.clock(), self.cpu_clock()
            idle = self.idle_cores * max(0.0, now - self.charged_at)
            cpu = max(0.0, cpu_now - self.charged - idle)
            self.idle_cpu_s += min(idle, max(0.0, cpu_now - self.charged))
            # a clock that went back (CPU moved to another machine's account after it was
            # charged here) pays it back from the next sections' CPU
            self.charged = max(self.charged, cpu_now)
            self.charged_at = now
            due = max(t0, self.free_at) + factor * cpu / self.cores
            self.free_at = max(due, now)
            self.sections += 1
            self.cpu_s += cpu
            self.service_s += factor * cpu / self.cores
            self.late_s += max(0.0, now - due)
        return max(0.0, due - now), cpu

    def unpaced_cpu_s(self) -> float | None:
        """CPU time the process used since the last section ended (not paced yet)."""
        return None if self.charged is None else max(0.0, self.cpu_clock() - self.charged)

    def totals(self) -> dict:
        return {"sections": self.sections, "cpu_s": self.cpu_s, "service_s": self.service_s,
                "late_s": self.late_s, "unpaced_cpu_s": self.unpaced_cpu_s(),
                "idle_cores": self.idle_cores, "idle_measured_cores": self.idle_measured,
                "idle_cpu_s": self.idle_cpu_s}


def idle_cores(seconds: float = IDLE_WINDOW_S) -> float:
    """The process's CPU per wall second (cores) while the calling thread does nothing for
    ``seconds``: what its other threads (Ray's) use when idle."""
    start = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    return _cores_since(*start)


async def idle_cores_async(seconds: float = IDLE_WINDOW_S) -> float:
    """``idle_cores`` for an asyncio actor (a PS shard): the event loop waits meanwhile."""
    start = time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    return _cores_since(*start)


def _cores_since(wall0: float, cpu0: float) -> float:
    wall = time.perf_counter() - wall0
    return (time.process_time() - cpu0) / wall if wall > 0 else 0.0


class StepPacer:
    """One training thread's steps on its worker's EmulatedMachine. A step is cut into sections
    at ``point``: before the compute (the pull), after it (so a slow machine's gradients leave
    late, as they would) and at the end (``end``: the send, the optimizer). Waiting inside a
    section (for a pull, an all-reduce) counts as time passed, as on a real machine."""

    def __init__(self, machine: EmulatedMachine, sleep: Callable[[float], None] = time.sleep):
        self.machine, self.sleep = machine, sleep
        self.steps = 0
        self.cpu_s = self.wall_s = self.slept_s = 0.0  # whole steps
        self.compute_cpu_s = self.compute_wall_s = 0.0  # compute sections
        self.pre_compute_cpu_s = 0.0  # the sections before them (the pull's side of a step)
        self.expected_s = 0.0  # Σ factor x cpu / cores over compute sections
        self._section = self._step = None
        self._step_cpu = 0.0
        self._first = False

    def begin(self) -> None:
        self._section = self._step = self.machine.open()
        self._step_cpu = 0.0
        self._first = True  # the step's first section is open

    def point(self, factor: float = 1.0, compute: bool = False) -> float:
        """End the current section (sleeping until it is due) and start the next; ``compute``:
        the section was the step's compute. Returns the seconds slept."""
        if self._section is None:
            return 0.0
        t0 = self._section
        wait, cpu = self.machine.close(t0, factor)
        if wait > 0:
            self.sleep(wait)
            self.slept_s += wait
        self._step_cpu += cpu
        if self._first and not compute:
            self.pre_compute_cpu_s += cpu
        self._first = False
        if compute:
            self.compute_cpu_s += cpu
            self.compute_wall_s += self.machine.clock() - t0
            self.expected_s += factor * cpu / self.machine.cores
        self._section = self.machine.open()
        return wait

    def end(self, factor: float = 1.0, count: bool = True) -> float:
        """The step is done: its last section paced, the step counted (unless ``count`` is
        false: a step without a batch of its own, e.g. sync's all-reduce of an idle worker)."""
        if self._step is None:
            return 0.0
        self._first = False  # a step's last section is never the one before its compute
        slept = self.point(factor)
        self.steps += count
        self.cpu_s += self._step_cpu
        self.wall_s += self.machine.clock() - self._step
        self._section = self._step = None
        return slept

    def totals(self) -> dict:
        return {"steps": self.steps, "cpu_s": self.cpu_s, "paced_wall_s": self.wall_s,
                "slept_s": self.slept_s, "compute_cpu_s": self.compute_cpu_s,
                "compute_wall_s": self.compute_wall_s, "expected_wall_s": self.expected_s,
                "pre_compute_cpu_s": self.pre_compute_cpu_s}

    @staticmethod
    def summed(pacers: list["StepPacer"]) -> dict:
        keys = ("steps", "cpu_s", "paced_wall_s", "slept_s", "compute_cpu_s", "compute_wall_s",
                "expected_wall_s", "pre_compute_cpu_s")
        return {k: sum(p.totals()[k] for p in pacers) for k in keys}


class RequestPacer:
    """A PS shard's requests on its EmulatedMachine (an asyncio actor): ``start()`` before a
    request's work, ``await finish(token)`` after it, before answering."""

    def __init__(self, machine: EmulatedMachine, sleep: Callable[[float], object] = asyncio.sleep):
        self.machine, self.sleep = machine, sleep

    def start(self) -> float:
        return self.machine.open()

    async def finish(self, token: float) -> float:
        wait, _ = self.machine.close(token)
        if wait > 0:
            await self.sleep(wait)
        return wait


def worker_entry(rank: int, totals: dict) -> dict:
    """A worker's line of summary.json's ``emulation.workers``: ``compute_wall_per_cpu`` (wall
    time of its compute sections over their CPU time), against ``expected`` = the straggler
    factor / cores (CPU-weighted), and ``wall_per_cpu`` (whole steps: those that wait for
    others, or for a pull, run longer); the CPU of the compute sections and of the sections
    before them; ``pull_s``: its training pulls' mean round trip (from the sends to the last
    answer, in wall time: the shards' paced work and queues, the transport and the worker's
    handling of the call at the machine's own speed)."""
    cpu, comp, pulls = totals["cpu_s"], totals["compute_cpu_s"], totals.get("pulls_timed")
    return {"rank": rank, "steps": totals["steps"], "cpu_s": cpu,
            "unpaced_cpu_s": totals.get("unpaced_cpu_s"), "idle_cores": totals.get("idle_cores"),
            "paced_wall_s": totals["paced_wall_s"], "slept_s": totals["slept_s"],
            "wall_per_cpu": totals["paced_wall_s"] / cpu if cpu > 0 else None,
            "compute_wall_per_cpu": totals["compute_wall_s"] / comp if comp > 0 else None,
            "expected": totals["expected_wall_s"] / comp if comp > 0 else None,
            "compute_cpu_s": comp, "pre_compute_cpu_s": totals.get("pre_compute_cpu_s"),
            "pull_s": totals["pull_round_trip_s"] / pulls if pulls else None,
            "shadow_thread": _shadow_entry(totals.get("shadow_thread"))}


def _shadow_entry(t: dict | None) -> dict | None:
    """A shadow thread's rounds on cores of its own: their CPU and paced wall time."""
    if t is None:
        return None
    return {"rounds": t["steps"], "cpu_s": t["cpu_s"], "paced_wall_s": t["paced_wall_s"],
            "slept_s": t["slept_s"],
            "wall_per_cpu": t["paced_wall_s"] / t["cpu_s"] if t["cpu_s"] > 0 else None}


def shard_entry(shard: int, totals: dict, cores: float) -> dict:
    """A shard's line: ``wall_per_cpu`` is its service time per CPU second (1 / cores, unless
    the work itself ran slower than the emulated cores: ``late_s``)."""
    cpu = totals["cpu_s"]
    service = totals["service_s"] + totals["late_s"]
    return {"shard": shard, "requests": totals["sections"], "cpu_s": cpu,
            "unpaced_cpu_s": totals.get("unpaced_cpu_s"), "idle_cores": totals.get("idle_cores"),
            "paced_wall_s": service, "late_s": totals["late_s"],
            "wall_per_cpu": service / cpu if cpu > 0 else None, "expected": 1.0 / cores}

