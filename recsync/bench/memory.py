"""Resident memory of a whole job, sampled while it runs.

``RssSampler`` polls, every ``interval_s`` (0.5 s), the RSS of the benchmark's own process (the
driver) and of every process that belongs to its job:

- all descendants of the driver: an embedded Ray instance is started by the driver, so its
  gcs_server, raylet, log monitor, dashboard and autoscaler processes are its children and the
  Ray worker processes (recsync's PS shards, workers and work queue, Ray's own agents) are
  children of the raylet;
- as a safety net, any process whose command line names the Ray session this driver started
  (``/tmp/ray/session_<date>_<driver pid>``), should Ray ever detach one (scanned every 4th
  poll, while Ray is initialised in this process).

Each poll sums the RSS of those processes; the sampler keeps the largest sum (the job's peak) and
each process's own peak, with its role read from the command line (a Ray actor's process title is
``ray::<Class>`` or ``ray::<Class>.<method>`` while it runs a method). RSS counts shared pages
(libraries, the memory-mapped data set) once per process, so the sum is an upper bound on the
memory the job really holds. (The proportional set size would not double-count, but reading it
walks a process's page tables: about 8 ms per large process per poll, too much to run beside the
training being measured.)

Each poll also reads every one of those processes' CPU time and the machine's, so that
``cpu_between`` can say how many cores each role (and everything outside the job) used over a
time window. A poll costs about 1-3 ms of the driver's CPU (reading /proc), under 1% of a core
at 0.5 s.
"""

from __future__ import annotations

import os
import re
import threading
import time

# isort: off
import ray  # first: it puts the psutil it bundles on sys.path
import psutil
# isort: on

ROLES = (  # (role, test on the command line), first match wins
    ("worker", lambda c: c.startswith("ray::Worker")),
    ("ps_shard", lambda c: c.startswith("ray::PSShard")),
    ("work_queue", lambda c: c.startswith("ray::WorkQueue")),
    ("ray_idle_worker", lambda c: c.startswith("ray::IDLE")),
    ("ray_agent", lambda c: c.startswith("ray::")),  # DashboardAgent, RuntimeEnvAgent, ...
    ("raylet", lambda c: "/raylet/raylet" in c),
    ("gcs_server", lambda c: "/gcs/gcs_server" in c),
    ("ray_python_daemon", lambda c: "site-packages/ray/" in c),  # monitor, log monitor, dashboard
)


SESSION_SCAN_EVERY = 4  # polls; the scan reads every process's command line (~2 ms)


def _machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used since boot (every core summed)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) \
        - getattr(t, "guest_nice", 0.0)


def role_of(cmdline: str) -> str:
    for role, test in ROLES:
        if test(cmdline):
            return role
    return "other"


class RssSampler:
    """Context manager: samples in a daemon thread from ``__enter__`` to ``__exit__``."""

    def __init__(self, interval_s: float = 0.5, root_pid: int | None = None):
        self.interval_s = interval_s
        self.root = psutil.Process(root_pid or os.getpid())
        self._session = re.compile(rf"session_[0-9_-]+_{self.root.pid}\b")
        self.peak_rss = 0
        self.peak_at_s = 0.0
        self.peak_processes: dict[str, int] = {}  # role -> processes counted at the peak
        self.per_process: dict[int, dict] = {}  # pid -> {"role", "cmdline", "peak_rss",
        # "create_time"}: every process of the job seen (also what may outlive it: leftovers.py)
        self.samples = 0
        self.series: list[tuple[float, dict[int, float], float]] = []  # (t, pid -> cpu s, busy)
        self._polls = 0
        self._detached: dict[int, psutil.Process] = {}  # found by the session scan only
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    # -- the job's processes ------------------------------------------------------------------
    def _processes(self) -> list[psutil.Process]:
        procs = {self.root.pid: self.root}
        try:
            for p in self.root.children(recursive=True):
                procs[p.pid] = p
        except psutil.NoSuchProcess:
            pass
        self._polls += 1
        if ray.is_initialized() and self._polls % SESSION_SCAN_EVERY == 1:
            for p in psutil.process_iter(["cmdline"]):
                if p.pid not in procs and self._session.search(" ".join(p.info["cmdline"] or [])):
                    self._detached[p.pid] = p
        for pid, p in list(self._detached.items()):
            if p.is_running():
                procs.setdefault(pid, p)
            else:
                del self._detached[pid]
        return list(procs.values())

    def sample(self) -> None:
        total_rss = 0
        roles: dict[str, int] = {}
        cpu: dict[int, float] = {}
        for p in self._processes():
            try:
                with p.oneshot():
                    rss = p.memory_info().rss
                    cmdline = " ".join(p.cmdline())
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
                    created = p.create_time()
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            role = "driver" if p.pid == self.root.pid else role_of(cmdline)
            total_rss += rss
            roles[role] = roles.get(role, 0) + 1
            rec = self.per_process.setdefault(p.pid, {"role": role, "cmdline": cmdline[:120],
                                                      "peak_rss": 0, "create_time": created})
            if role not in ("ray_idle_worker", "other"):  # an idle Ray worker became an actor
                rec["role"], rec["cmdline"] = role, cmdline[:120]
            rec["peak_rss"] = max(rec["peak_rss"], rss)
        self.samples += 1
        self.series.append((time.perf_counter(), cpu, _machine_busy_s()))
        if total_rss > self.peak_rss:
            self.peak_rss, self.peak_at_s, self.peak_processes = (
                total_rss, time.perf_counter() - self._start, roles)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.sample()
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - started)))

    def __enter__(self) -> RssSampler:
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    # -- results --------------------------------------------------------------------------------
    def cpu_between(self, t0: float, t1: float) -> dict | None:
        """Cores used on average between perf_counter times ``t0`` and ``t1`` (the polls just
        inside them): by role of this job's processes, the job, and every process on the
        machine (so ``other`` is what processes outside the job took)."""
        inside = [s for s in self.series if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return None
        (ta, ca, ba), (tb, cb, bb) = inside[0], inside[-1]
        dt = tb - ta
        by_role: dict[str, float] = {}
        for pid, c in cb.items():
            role = self.per_process.get(pid, {}).get("role", "other")
            by_role[role] = by_role.get(role, 0.0) + (c - ca.get(pid, 0.0)) / dt
        job = sum(by_role.values())
        machine = (bb - ba) / dt
        return {"window_s": dt, "cores_by_role": by_role, "job_cores": job,
                "machine_busy_cores": machine, "other_cores": max(0.0, machine - job)}

    def peak_of(self, role: str) -> int | None:
        """The largest peak RSS of any one process with this role (None if there was none)."""
        peaks = [r["peak_rss"] for r in self.per_process.values() if r["role"] == role]
        return max(peaks) if peaks else None

    def result(self) -> dict:
        by_role: dict[str, dict] = {}
        for r in self.per_process.values():
            d = by_role.setdefault(r["role"], {"processes": 0, "max_peak_rss": 0})
            d["processes"] += 1
            d["max_peak_rss"] = max(d["max_peak_rss"], r["peak_rss"])
        return {"interval_s": self.interval_s, "samples": self.samples,
                "peak_total_rss": self.peak_rss,
                "peak_at_s": self.peak_at_s, "processes_at_peak": self.peak_processes,
                "worker_peak_rss": self.peak_of("worker"),
                "ps_shard_peak_rss": self.peak_of("ps_shard"),
                "driver_peak_rss": self.peak_of("driver"),
                "by_role": by_role}
