"""The model of time of a simulated cluster: what a worker's step costs, how fast each worker
is, and what a message and a shard's work take. Plain data and arithmetic, no clock.

Defaults are measurements of this project's `recsync bench ps` (one PS shard on a 2-core VM),
for the transport of the config (``cluster.transport``, ``Timing.on``). The direct path (the
default; docs/benchmarks/2026-11-28-shard-cpu.md, run ps_new on the Intel VM): a pull of no ids
took 0.29 ms there and back, 0.22 ms of it the shard process's CPU; a pull of 6,656 rows 1.42
ms (1.24 of the shard's CPU), a push 2.59 (2.41). A shard serves one call at a time on its
CPU, so that CPU is a call's service: a line through the call without rows and the one with
rows (the fixed part the handling of any call in the shard's process: the message, the event
loop, the answer; then ShardCore's work per row), the rest of the round trip latency. Ray actor
calls (docs/benchmarks/2026-11-26-ps.md; their shard CPU not measured): a call without arrays
1.07 ms; a pull 4.82 and 12.92 ms, a push 6.67 and 19.09 ms at 6,656 and 53,248 rows, a line
through the two sizes less the call without arrays (the latency). The bandwidth between machines
is not measured here: 10 Gbit/s is a common NIC, and a setting.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

# bench ps: (a call without rows' round trip s, (rows per call, s) of a pull and of a push at 256
# and 2,048 ids x 26 tables), per transport ("direct" from run ps_new at 877dbf9 on the Intel
# VM, docs/benchmarks/2026-11-28-shard-cpu.md; "ray" from 2026-11-26). Of "direct" the model
# reads only the call without rows (the calls' walls are the record of that run: a call's
# service is its shard CPU, MEASURED_SHARD_CPU below)
MEASURED_CALLS = {
    "direct": (0.2899e-3, ((6_656, 1.4189e-3), (53_248, 4.1126e-3)),
               ((6_656, 2.5860e-3), (53_248, 15.9575e-3))),
    "ray": (1.072e-3, ((6_656, 4.82e-3), (53_248, 12.92e-3)),
            ((6_656, 6.67e-3), (53_248, 19.09e-3))),
}
# the same run: the shard process's CPU per call (every thread, from /proc): a call without
# rows, then (rows, s) of a pull and of a push at 256 ids x 26 tables. What a shard spends on a
# call is what its queue serves (not measured for "ray"). The calls of 2,048 ids cost less per
# row (3.76 ms a pull, 15.37 a push: random rows of 1M-row tables, whose misses overlap more
# in a larger gather): the line through a call without rows and the small one fits the few
# hundred rows a call of a simulation at scale carries, and overstates the largest calls.
MEASURED_SHARD_CPU = {"direct": (0.2189e-3, (6_656, 1.2381e-3), (6_656, 2.4125e-3))}


def _line(points, bare_s: float) -> tuple[float, float]:
    """(fixed s per call less ``bare_s``, s per row) through two (rows, s)."""
    (r0, s0), (r1, s1) = points
    per_row = (s1 - s0) / (r1 - r0)
    return s0 - r0 * per_row - bare_s, per_row


def call_costs(transport: str) -> dict[str, float]:
    """Timing's fields for a transport's measured calls. Where the shard's CPU per call was
    measured, a call's service at the shard is a line through a call without rows' CPU there
    (the handling of any call in the shard's process) and a call with rows', and the latency
    each way half of what a call without rows takes beyond its CPU; else the service is a line
    through the calls' wall times less a call without rows' round trip, which is the latency
    (the shard's CPU in that round trip then counted as latency, not as service: before
    2026-11-28 the direct path's too, which made a shard about half as busy as measured)."""
    bare_s, pulls, pushes = MEASURED_CALLS[transport]
    if transport in MEASURED_SHARD_CPU:
        bare_cpu_s, pull, push = MEASURED_SHARD_CPU[transport]
        pull_call_s, pull_s_per_row = _line(((0, bare_cpu_s), pull), 0.0)
        push_call_s, push_s_per_row = _line(((0, bare_cpu_s), push), 0.0)
        latency_s = (bare_s - bare_cpu_s) / 2
    else:
        pull_call_s, pull_s_per_row = _line(pulls, bare_s)
        push_call_s, push_s_per_row = _line(pushes, bare_s)
        latency_s = bare_s / 2
    return {"latency_s": latency_s, "pull_call_s": pull_call_s,
            "pull_s_per_row": pull_s_per_row, "push_call_s": push_call_s,
            "push_s_per_row": push_s_per_row}


DIRECT = call_costs("direct")  # pull 0.219 ms + 0.153 us/row, push 0.219 ms + 0.330 us/row
RAY = call_costs("ray")  # pull 2.59 ms + 0.174 us/row, push 3.83 ms + 0.267 us/row
BYTES_PER_S = 10e9 / 8  # 10 Gbit/s
# A gloo all-reduce of the 1.9 MB dense vector between two processes took 2.3 ms
# (docs/benchmarks/2026-11-22-shadow.md); under the ring model at BYTES_PER_S, 2 messages of
# half of it: each message's fixed cost is what is left (the members' CPU is in that wall).
COLLECTIVE_LATENCY_S = 2.3e-3 / 2 - 0.95e6 / BYTES_PER_S
# A gloo all-reduce's own CPU in each member (reducing and copying what it receives and sends):
# 119,000 to 1,904,000 floats among 2, 3 and 4 processes on this VM took 0.47-4.23 ms of each
# process's CPU (time.process_time, medians of 40 calls); least squares through the nine
# points: 0.169 ms a call + per message of the ring (2 (n - 1) of b / n bytes each) 0.0815 ms +
# 0.309 ns a byte, within 10% of each (docs/benchmarks/2026-11-28-simulated-collective.md)
COLLECTIVE_CPU_S_PER_CALL = 0.169e-3
COLLECTIVE_CPU_S_PER_MESSAGE = 0.0815e-3
COLLECTIVE_CPU_S_PER_BYTE = 0.309e-9
SPEED_KINDS = ("constant", "stragglers", "lognormal", "trace")
MEASURED = ("compute_s", "pull_side_s", "push_side_s")  # Timing's fields None = measured here


@dataclass(frozen=True)
class Speeds:
    """How many times slower than the measured step each worker computes (its factor; 1 =
    the measured cost). ``constant``: all 1. ``stragglers``: a ``share`` of the workers
    (drawn with ``seed``) each ``low``-``high`` times slower (uniform), the rest 1.
    ``lognormal``: every worker exp(N(0, ``sigma``)) (heterogeneous machines). ``trace``: a
    JSON file, a list with one entry per worker: a factor, or [[from_s, factor], ...] (the
    factor from that simulated second on; 1 before the first)."""

    kind: str = "constant"
    share: float = 0.1
    low: float = 2.0
    high: float = 5.0
    sigma: float = 0.25
    trace: str | None = None
    seed: int = 0

    def __post_init__(self):
        if self.kind not in SPEED_KINDS:
            raise ValueError(f"speeds.kind = {self.kind!r}; valid: {', '.join(SPEED_KINDS)}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"speeds.share = {self.share}: a share of the workers, 0 to 1")
        if not 1.0 <= self.low <= self.high:
            raise ValueError(f"speeds.low, high = {self.low}, {self.high}: factors with "
                             f"1 <= low <= high")
        if self.kind == "trace" and not self.trace:
            raise ValueError("speeds.kind = 'trace' needs speeds.trace, a JSON file")

    def schedule(self, workers: int) -> WorkerSpeeds:
        """Each worker's factor over simulated time."""
        rng = np.random.default_rng(self.seed)
        if self.kind == "constant":
            return WorkerSpeeds([[(0.0, 1.0)] for _ in range(workers)])
        if self.kind == "stragglers":
            slow = rng.permutation(workers)[:round(self.share * workers)]
            factors = np.ones(workers)
            factors[slow] = rng.uniform(self.low, self.high, len(slow))
            return WorkerSpeeds([[(0.0, float(f))] for f in factors])
        if self.kind == "lognormal":
            return WorkerSpeeds([[(0.0, float(f))]
                                 for f in np.exp(rng.normal(0.0, self.sigma, workers))])
        return WorkerSpeeds.read(Path(self.trace), workers)


@dataclass
class WorkerSpeeds:
    """Per worker, [(from_s, factor), ...] in time order."""

    steps: list[list[tuple[float, float]]]

    @classmethod
    def read(cls, path: Path, workers: int) -> WorkerSpeeds:
        entries = json.loads(path.read_text())
        if not isinstance(entries, list) or len(entries) != workers:
            raise ValueError(f"{path}: a speed trace is a JSON list with one entry per worker "
                             f"({workers}), got {type(entries).__name__} of "
                             f"{len(entries) if isinstance(entries, list) else '?'}")
        out = []
        for rank, e in enumerate(entries):
            pairs = [(0.0, float(e))] if isinstance(e, (int, float)) else [
                (float(t), float(f)) for t, f in e]
            if any(f <= 0 or not math.isfinite(f) for _, f in pairs):
                raise ValueError(f"{path}: worker {rank}: factors must be finite and > 0")
            out.append(sorted(pairs) if pairs and pairs[0][0] == 0.0
                       else [(0.0, 1.0), *sorted(pairs)])
        return cls(out)

    def factor(self, rank: int, now_s: float) -> float:
        f = 1.0
        for start, factor in self.steps[rank]:
            if start > now_s:
                break
            f = factor
        return f

    def initial(self) -> list[float]:
        return [s[0][1] for s in self.steps]


@functools.lru_cache(maxsize=4096)
def common_normal(seed: int, index: int) -> float:
    """The standard normal draw of bin ``index`` of the clock that every worker shares
    (Timing.jitter_common)."""
    return float(np.random.default_rng((seed, index, 11)).normal())


@dataclass(frozen=True)
class Timing:
    """The costs of a simulated cluster. ``compute_s``: one worker step's forward and backward
    at factor 1; the worker's own CPU per step besides, at factor 1: ``pull_side_s`` before
    its compute (deduplication, routing, merging the answers), charged with the compute (after
    the pull read, before the push leaves), and ``push_side_s`` after it (gathering and sending
    the gradients, the mode's bookkeeping), charged after the push left, before the next pull,
    as the EMULATED runtime paces them (None: each measured on this machine before the run,
    run.py). A message of b bytes
    takes ``latency_s + b / bytes_per_s`` one way; a shard serves one call at a time, a pull
    of r rows in ``pull_call_s + pull_s_per_row x r``, a push in ``push_call_s +
    push_s_per_row x r``; taking a chunk
    from the work queue is one round trip. An all-reduce of b bytes among n workers is a ring:
    2 (n - 1) messages of b / n bytes one after another, each ``collective_latency_s`` plus
    its bytes at ``bytes_per_s`` (fitted to an all-reduce's wall at full speed, its CPU in
    it). Each member's own CPU in it, at factor 1: ``collective_cpu_s_per_call``, and on every
    message ``collective_cpu_s_per_message`` plus ``collective_cpu_s_per_byte`` per byte; a
    worker slower than factor 1 takes (factor - 1) x that more, after its compute; paced, the
    CPU x factor is a floor that the section's waits count toward. A shard's service of a
    call also takes ``pull_call_s`` or ``push_call_s`` whatever its rows (the handling of the
    call in the shard's process). The defaults are the direct path's (``cluster.transport``'s
    default); ``on("ray")`` gives Ray calls' costs."""

    compute_s: float | None = None
    pull_side_s: float | None = None
    push_side_s: float | None = None
    latency_s: float = DIRECT["latency_s"]
    bytes_per_s: float = BYTES_PER_S
    pull_s_per_row: float = DIRECT["pull_s_per_row"]
    push_s_per_row: float = DIRECT["push_s_per_row"]
    pull_call_s: float = DIRECT["pull_call_s"]
    push_call_s: float = DIRECT["push_call_s"]
    collective_latency_s: float = COLLECTIVE_LATENCY_S
    collective_cpu_s_per_call: float = COLLECTIVE_CPU_S_PER_CALL
    collective_cpu_s_per_message: float = COLLECTIVE_CPU_S_PER_MESSAGE
    collective_cpu_s_per_byte: float = COLLECTIVE_CPU_S_PER_BYTE
    # the worker's own CPU as the EMULATED runtime paces it (cluster/emulation.py StepPacer):
    # each section of a step (up to the compute; after it) lasts at least its CPU x factor,
    # and waiting inside it (for a pull, the all-reduce, the push window) counts toward that;
    # False: the CPU comes on top of the waits, as on a machine of its own
    paced: bool = False
    jitter: float = 0.0  # each step's compute and own CPU x exp(N(0, jitter)), per worker
    # seeded (0: every step alike, and equal workers stay exactly in step)
    # the share of jitter's variance common to every worker (a host's variation, which
    # co-located workers share): one draw per step-long bin of the simulated clock
    # (jitter_period_s); the rest each worker's own, drawn each time (0: all its own)
    jitter_common: float = 0.0
    # a shard process's CPU by the second (its other threads: Ray's), as the EMULATED pacer
    # charges it: to the call that ends next; here each call's service is longer by this many
    # seconds for every second since the shard's previous call came (0: none). At one
    # worker a call then pays for the whole gap before it, at four for a quarter of it
    shard_background: float = 0.0
    speeds: Speeds = field(default_factory=Speeds)

    def __post_init__(self):
        for name in ("latency_s", "pull_s_per_row", "push_s_per_row", "pull_call_s",
                     "push_call_s", "collective_latency_s", "collective_cpu_s_per_call",
                     "collective_cpu_s_per_message", "collective_cpu_s_per_byte", "jitter",
                     "shard_background"):
            if getattr(self, name) < 0:
                raise ValueError(f"timing.{name} = {getattr(self, name)}: must be >= 0")
        if not 0.0 <= self.jitter_common <= 1.0:
            raise ValueError(f"timing.jitter_common = {self.jitter_common}: must be in [0, 1]")
        if self.bytes_per_s <= 0:
            raise ValueError(f"timing.bytes_per_s = {self.bytes_per_s}: must be > 0")
        for name in MEASURED:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"timing.{name} = {value}: must be >= 0 (or None: measured)")

    def on(self, transport: str) -> Timing:
        """These costs for ``cluster.transport``: with "ray", each call cost still at its
        direct-path default becomes Ray calls' measured one (a cost set by hand stays)."""
        if transport == "direct":
            return self
        costs = call_costs(transport)
        return replace(self, **{k: v for k, v in costs.items() if getattr(self, k) == DIRECT[k]})

    def jitter_period_s(self) -> float:
        """How long a common draw of the jitter lasts: a step's compute and own CPU at factor
        1 (about a step, as a host's variation moved both real workers' steps alike, measured
        in docs/benchmarks/2026-11-28-common-jitter.md)."""
        return max(1e-6, sum(getattr(self, k) or 0.0
                             for k in ("compute_s", "pull_side_s", "push_side_s")))

    def jitter_log(self, own: np.random.Generator, now: float) -> float:
        """The log of a jitter factor at ``now``: the worker's own draw (from ``own``, its
        generator) plus the draw common to every worker in this bin of the clock."""
        z = own.normal(0.0, self.jitter * math.sqrt(1.0 - self.jitter_common))
        if self.jitter_common:
            z += self.jitter * math.sqrt(self.jitter_common) * common_normal(
                self.speeds.seed, int(now // self.jitter_period_s()))
        return z

    def message_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def pull_service_s(self, rows: int) -> float:
        return self.pull_call_s + rows * self.pull_s_per_row

    def push_service_s(self, rows: int) -> float:
        return self.push_call_s + rows * self.push_s_per_row

    def all_reduce_s(self, nbytes: int, workers: int) -> float:
        if workers <= 1:
            return 0.0
        return 2 * (workers - 1) * (self.collective_latency_s
                                    + nbytes / workers / self.bytes_per_s)

    def all_reduce_cpu_s(self, nbytes: int, workers: int) -> float:
        """One member's own CPU in an all-reduce of ``nbytes`` among ``workers``, at factor 1."""
        if workers <= 1:
            return 0.0
        return self.collective_cpu_s_per_call + 2 * (workers - 1) * (
            self.collective_cpu_s_per_message + nbytes / workers * self.collective_cpu_s_per_byte)

    def with_network(self, latency_ms: float, ms_per_mb: float) -> Timing:
        """These costs plus the config's EMULATED network delay (``network.latency_ms``, half
        each way, and ``network.ms_per_mb``), as the shards add it to every call."""
        per_byte = ms_per_mb / 1e3 / 2**20
        return replace(self, latency_s=self.latency_s + latency_ms / 2e3,
                       bytes_per_s=1.0 / (1.0 / self.bytes_per_s + per_byte))

    def as_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)
