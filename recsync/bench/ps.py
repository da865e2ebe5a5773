"""Scenario `ps`: rows/s of one PS shard's pull and push, through Ray, in process and raw.

One shard of 26 tables x 1M rows (x ``--scale``) x dim 16, row-wise Adagrad, mode async's rule
(``ApplyNow``), built by ps/build.py as a run builds it. Every row is touched before timing, so
lazy initialisation is checked but never run (the steady state of a long run). At 256, 2,048 and
16,384 unique ids per table per call (sorted int64, as PSClient sends them; new random ids every
call, the same sequence on every path), these paths:

- ``direct``: one PSShard actor on an embedded Ray instance, called over its direct data path
  (``cluster.transport = "direct"``, the default; ps/channel.py) as PSClient calls it, each call
  waited for before the next: the path a worker's pulls and pushes take in a run.
- ``ray``: the same actor called as Ray actor calls (``cluster.transport = "ray"``):
  ``pull.remote(ids, 0)`` and ``push.remote(ids, grads, None, meta)`` with one int64 array and
  one float32 [n, 16] array per table; each call is waited for (``ray.get``) before the next.
  Timed: serialisation both ways, the object store for arguments over Ray's inline limit, the
  actor's event loop and ShardCore's work. Not timed: the client's dedup and merge.
- ``ray_echo``: Ray's transport floor: an asyncio actor taking the same arguments and answering
  with arrays of the same shapes, doing no work (``_Echo``). ``ray`` minus ``ray_echo`` is about
  what the shard's work adds to a call; ``ray_echo`` is what no shard code can take away.
- ``core``: the same ShardCore in this process, the same calls, no Ray.
- ``raw``: plain tensors of the same size, no store: ``index_select`` per table for a pull; for a
  push, row-wise Adagrad by hand: rows and state gathered (``index_select``), state += mean(g²),
  rows -= lr g / (sqrt(state) + eps), both written back (``index_copy_``), the torch ops of the
  store's rule without the store around them. Beside it, ``raw_index_add``: one ``index_add_``
  of the gradients per table (SGD with no state; the issue's first probe used it).

Each point: ``WARMUP_CALLS`` calls, then ``CALLS`` timed ones (x ``--scale``, at least
``MIN_CALLS``); medians. rows/s = 26 x ids / seconds per call. The in-process paths run with as
many torch threads as the shard's process has.

Then the saturation curve (ps_saturation.py): DLRM async with 1 to 12 workers against one shard
on the EMULATED cluster, ``ratios.workers_per_shard_at_90pct`` and where the shard's time goes.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from recsync.bench import ps_saturation as saturation

NUM_TABLES = 26
TABLE_ROWS = 1_000_000  # per table, x --scale
DIM = 16
IDS_PER_TABLE = (256, 2048, 16384)  # unique ids per table per call (kept at every --scale)
CALLS = 20  # timed calls per point, x --scale
MIN_CALLS = 3
WARMUP_CALLS = 3
TOUCH_IDS = 65_536  # ids per table of each pull that touches every row before timing
SEED = 0
PUSH_META = {"version_read": 0, "lr_scale": 1.0, "sampled": None}  # what PSClient adds (async)
PATHS = ("raw", "core", "direct", "ray", "ray_echo")
WORKER_PATH = "direct"  # the path of cluster.transport's default: what the ray_vs_core_* ratios read
Call = Callable[[list[np.ndarray], list[np.ndarray]], object]


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    rows = max(2 * max(IDS_PER_TABLE), round(TABLE_ROWS * scale))
    calls = max(MIN_CALLS, round(CALLS * scale))
    load = os.getloadavg()[0]
    ray_points, facts = through_ray(rows, calls, WARMUP_CALLS)
    points = in_process(rows, calls, WARMUP_CALLS, facts["torch_threads"]) + ray_points
    curve = saturation.measure(out, scale)
    return results(points, facts, rows=rows, calls=calls, load=load,
                   wall_s=time.perf_counter() - started,
                   saturation=saturation.result_part(curve, out))


# -- what is measured ----------------------------------------------------------------------------
def shard_config():
    """The RunConfig a shard of this benchmark is built from: mode async, one shard, row-wise
    Adagrad at the default learning rate."""
    from recsync.config import load_config
    return load_config(None, ['mode="async"', "cluster.ps_shards=1",
                              'train.embedding_optimizer="adagrad"'])


def table_specs(rows: int) -> list:
    from recsync.embedding.spec import TableSpec
    return [TableSpec(f"t{t}", rows, DIM) for t in range(NUM_TABLES)]


def touched_core(tables: list, cfg):
    """Shard 0 of 1's ShardCore as a run builds it (ps/build.py), every row pulled once."""
    from recsync.ps.build import make_core
    core = make_core(tables, cfg, 0, None)
    rows = tables[0].rows
    for start in range(0, rows, TOUCH_IDS):
        core.pull([np.arange(start, min(rows, start + TOUCH_IDS), dtype=np.int64)] * len(tables))
    return core


class RawTables:
    """Tables of the same size as plain tensors, and the torch ops a pull and a push come to."""

    def __init__(self, rows: int, lr: float, eps: float = 1e-8):
        self.weights = [torch.rand(rows, DIM) for _ in range(NUM_TABLES)]
        self.state = [torch.zeros(rows, 1) for _ in range(NUM_TABLES)]
        self.lr, self.eps = lr, eps

    def pull(self, ids, grads) -> list[torch.Tensor]:
        return [w.index_select(0, torch.from_numpy(i)) for w, i in zip(self.weights, ids)]

    def push_adagrad(self, ids, grads) -> None:
        # gather, update, scatter: 2-3x faster here than index_add_ into the tables (whose CPU
        # kernel is slow), with unique ids the same update
        for w, s, i, g in zip(self.weights, self.state, ids, grads):
            i, g = torch.from_numpy(i), torch.from_numpy(g)
            rows, state = w.index_select(0, i), s.index_select(0, i)
            state.add_(g.square().mean(1, keepdim=True))
            rows.addcdiv_(g, state.sqrt().add_(self.eps), value=-self.lr)
            w.index_copy_(0, i, rows)
            s.index_copy_(0, i, state)

    def push_index_add(self, ids, grads) -> None:
        for w, i, g in zip(self.weights, ids, grads):
            w.index_add_(0, torch.from_numpy(i), torch.from_numpy(g), alpha=-self.lr)


def random_ids(rng: np.random.Generator, rows: int, n: int) -> list[np.ndarray]:
    """One call's ids: ``n`` unique ids per table, sorted int64."""
    return [np.sort(rng.choice(rows, n, replace=False)).astype(np.int64)
            for _ in range(NUM_TABLES)]


def measure_path(path: str, ops: dict[str, Call], rows: int, calls: int,
                 warmup: int, cpu: Callable[[], float | None] | None = None) -> list[dict]:
    """One point per ids-per-table size and op of ``ops`` (op -> fn(ids, grads)): the seconds of
    ``calls`` calls after ``warmup`` untimed ones, each call with new ids (one seed: every path
    gets the same ids); with ``cpu`` (the shard process's CPU seconds so far), the shard's CPU
    per timed call too (``shard_cpu_ms_per_call``)."""
    rng = np.random.default_rng(SEED)
    points = []
    for n in IDS_PER_TABLE:
        grads = [rng.standard_normal((n, DIM), dtype=np.float32) * np.float32(1e-2)
                 for _ in range(NUM_TABLES)]
        ids = [random_ids(rng, rows, n) for _ in range(warmup + calls)]
        for op, fn in ops.items():
            times = []
            for k, call_ids in enumerate(ids):
                if k == warmup:
                    cpu_before = cpu() if cpu else None
                begin = time.perf_counter()
                fn(call_ids, grads)
                if k >= warmup:
                    times.append(time.perf_counter() - begin)
            points.append(point(path, op, n, times))
            if cpu:
                points[-1]["shard_cpu_ms_per_call"] = cpu_per_call_ms(cpu_before, cpu(), calls)
    return points


def process_cpu_s(pid: int) -> float | None:
    """The CPU time of every thread of process ``pid`` so far (Linux's schedstat, in ns: a
    clock tick, 10 ms, is longer than the calls timed); None where it cannot be read."""
    def thread_ns(task: str) -> int:
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            return int(f.read().split()[0])

    try:
        return sum(thread_ns(t) for t in os.listdir(f"/proc/{pid}/task")) / 1e9
    except (OSError, ValueError, IndexError):  # (also a thread that ended while read)
        return None


def cpu_per_call_ms(before: float | None, after: float | None, calls: int) -> float | None:
    return None if before is None or after is None else (after - before) / calls * 1e3


def point(path: str, op: str, n: int, times: list[float]) -> dict:
    s = statistics.median(times)
    return {"path": path, "op": op, "ids_per_table": n, "rows_per_call": NUM_TABLES * n,
            "calls": len(times), "ms_per_call": s * 1e3, "rows_per_s": NUM_TABLES * n / s,
            "ms_min": min(times) * 1e3, "ms_max": max(times) * 1e3}


def in_process(rows: int, calls: int, warmup: int, threads: int) -> list[dict]:
    """The ``core``, ``raw`` and ``raw_index_add`` points, with ``threads`` torch threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg = shard_config()
        points = core_points(cfg, rows, calls, warmup)  # its tables freed before the raw ones
        raw = RawTables(rows, cfg.train.embedding_lr)
        points += measure_path("raw", {"pull": raw.pull, "push": raw.push_adagrad},
                               rows, calls, warmup)
        points += measure_path("raw_index_add", {"push": raw.push_index_add},
                               rows, calls, warmup)
    finally:
        torch.set_num_threads(before)
    return points


def core_points(cfg, rows: int, calls: int, warmup: int) -> list[dict]:
    core = touched_core(table_specs(rows), cfg)
    return measure_path("core", {
        "pull": lambda ids, grads: core.pull(ids),
        "push": lambda ids, grads: core.push(ids, grads, None, dict(PUSH_META))},
        rows, calls, warmup)


def torch_threads() -> int:
    return torch.get_num_threads()


class _Echo:
    """Ray's transport floor: an asyncio actor, as PSShard, that takes a pull's or a push's
    arguments and answers with arrays of the shapes PSShard answers with, doing no work."""

    def __init__(self, max_ids: int):
        self.rows = np.zeros((max_ids, DIM), np.float32)

    async def pull(self, ids, min_version: int = 0):
        return [self.rows[:len(i)] for i in ids], None, 0

    async def push(self, ids, grads, dense_grad, meta: dict) -> int:
        return 0


def call_times(call, warmup: int, calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls after ``warmup`` untimed ones."""
    times = []
    for k in range(warmup + calls):
        begin = time.perf_counter()
        call()
        if k >= warmup:
            times.append(time.perf_counter() - begin)
    return times


def through_ray(rows: int, calls: int, warmup: int) -> tuple[list[dict], dict]:
    """The ``direct``, ``ray`` and ``ray_echo`` points, on an embedded Ray instance (loopback,
    no dashboard) shut down after; and facts: the shard process's torch threads, a call without
    arrays (ms, median), Ray's version."""
    import ray

    from recsync.bench.overhead import embedded_ray
    from recsync.cluster.ray_session import ray_session
    from recsync.ps.channel import ShardChannel
    from recsync.ps.shard import PSShard
    RayEcho = ray.remote(num_cpus=0)(_Echo)  # noqa: N806 (an actor class)
    cfg = shard_config()
    with embedded_ray(), ray_session(cfg.cluster):
        # a task with no CPUs, as the shard: Ray gives its process the same thread settings
        threads = ray.get(ray.remote(num_cpus=0)(torch_threads).remote())
        shard = PSShard.remote(functools.partial(touched_core, table_specs(rows), cfg))
        # the first call waits for the shard to be built
        noop = call_times(lambda: ray.get(shard.where.remote()), warmup, calls)
        channel = ShardChannel(ray.get(shard.channel.remote()))
        empty = [np.empty(0, np.int64)] * NUM_TABLES
        # the shard's process is on this machine: its CPU read from outside, costing it none
        cpu = functools.partial(process_cpu_s, ray.get(shard.stats.remote())["pid"])
        cpu_before = cpu()
        direct_noop = call_times(lambda: channel.call("pull", empty, 0).result(), 0,
                                 warmup + calls)[warmup:]
        noop_cpu_ms = cpu_per_call_ms(cpu_before, cpu(), warmup + calls)
        points = measure_path("direct", {
            "pull": lambda ids, grads: channel.call("pull", ids, 0).result(),
            "push": lambda ids, grads: channel.call("push", ids, grads, None,
                                                    PUSH_META).result()},
            rows, calls, warmup, cpu)
        channel.close()
        points += measure_path("ray", {
            "pull": lambda ids, grads: ray.get(shard.pull.remote(ids, 0)),
            "push": lambda ids, grads: ray.get(shard.push.remote(ids, grads, None, PUSH_META))},
            rows, calls, warmup)
        ray.kill(shard)
        echo = RayEcho.remote(max(IDS_PER_TABLE))
        points += measure_path("ray_echo", {
            "pull": lambda ids, grads: ray.get(echo.pull.remote(ids, 0)),
            "push": lambda ids, grads: ray.get(echo.push.remote(ids, grads, None, PUSH_META))},
            rows, calls, warmup)
        ray.kill(echo)
    return points, {"torch_threads": threads, "noop_ms": statistics.median(noop) * 1e3,
                    "direct_noop_ms": statistics.median(direct_noop) * 1e3,
                    "direct_noop_shard_cpu_ms": noop_cpu_ms,
                    "ray": ray.__version__}


# -- the result ----------------------------------------------------------------------------------
def results(points: list[dict], facts: dict, *, rows: int, calls: int, load: float,
            wall_s: float, saturation: dict | None = None) -> dict:
    """The scenario's result from its points (any order) and the Ray facts, with the
    saturation curve's part (ps_saturation.result_part) where there is one."""
    from recsync.bench.report import _table  # here: the shard's process imports this module
    at = {(p["path"], p["op"], p["ids_per_table"]): p for p in points}
    ratios = {f"ray_vs_core_{op}_{n}": (at[WORKER_PATH, op, n]["rows_per_s"]
                                         / at["core", op, n]["rows_per_s"])
              for op in ("pull", "push") for n in IDS_PER_TABLE}
    ratios.update({f"ray_call_vs_core_{op}_{n}": (at["ray", op, n]["rows_per_s"]
                                                  / at["core", op, n]["rows_per_s"])
                   for op in ("pull", "push") for n in IDS_PER_TABLE})
    ratios["pull_ms_256"] = at[WORKER_PATH, "pull", 256]["ms_per_call"]
    ratios["push_ms_256"] = at[WORKER_PATH, "push", 256]["ms_per_call"]
    ratios["ray_call_pull_ms_256"] = at["ray", "pull", 256]["ms_per_call"]
    for op in ("pull", "push"):
        ratios[f"transport_share_{op}_2048"] = (at["ray_echo", op, 2048]["ms_per_call"]
                                                / at["ray", op, 2048]["ms_per_call"])
        ratios[f"core_vs_raw_{op}_2048"] = (at["core", op, 2048]["rows_per_s"]
                                            / at["raw", op, 2048]["rows_per_s"])
    arms = {path: {"samples_per_s": None, **{
        f"{op}_{key}": {str(n): at[path, op, n][key] for n in IDS_PER_TABLE}
        for op in ("pull", "push") for key in ("rows_per_s", "ms_per_call")}}
        for path in PATHS}

    def cell(path, op, n):
        p = at.get((path, op, n))
        return "" if p is None else f"{p['rows_per_s'] / 1e6:.2f} ({p['ms_per_call']:.2f} ms)"

    header = ["op", "unique ids per table (rows per call)", "raw torch", "ShardCore in process",
              "PSShard, direct path", "PSShard via Ray calls", "Ray transport only (echo)",
              "raw index_add_ (no state)"]
    table = [[op, f"{n:,} ({NUM_TABLES * n:,})",
              *(cell(path, op, n) for path in (*PATHS, "raw_index_add"))]
             for op in ("pull", "push") for n in IDS_PER_TABLE]
    description = (
        f"One PS shard, {NUM_TABLES} tables x {rows:,} rows x {DIM}, row-wise Adagrad, mode "
        f"async's rule (ApplyNow), every row touched before timing. Million rows per second "
        f"(milliseconds per call), medians of {calls} calls after {WARMUP_CALLS} warm-up calls "
        f"per point; one call = one pull or push of all {NUM_TABLES} tables.\n\n"
        + _table(header, table) + "\n\n"
        "What each path times: **PSShard, direct path** (`cluster.transport = \"direct\"`, the "
        "default, the path of a worker's pulls and pushes in a run; the `ray_vs_core_*` and "
        "`pull_ms_256` ratios read it): the same calls over the shard's own TCP connection "
        "(ps/channel.py), `channel.call(\"pull\", ids, 0).result()`: pickling with the arrays "
        "out of band, loopback TCP, the actor's event loop and ShardCore's work. "
        "**PSShard via Ray calls** (`cluster.transport = \"ray\"`; ratios `ray_call_vs_core_*`): "
        "`ray.get(shard.pull.remote(ids, 0))` and "
        "`ray.get(shard.push.remote(ids, grads, None, meta))` from this process (the driver) to "
        "one PSShard actor, the arguments PSClient sends (one int64 array of sorted unique ids "
        "and one float32 [n, 16] gradient array per table, no dense part), each call waited "
        "for before the next: serialisation both ways, Ray's object store, the actor's event "
        "loop and ShardCore's work; not the client's dedup and merge, and not the overlap of a "
        "push window. **Ray transport only (echo)**: the same calls to an asyncio actor that "
        "answers with arrays of the same shapes and does no work: Ray's floor for these "
        "arguments and answers. **ShardCore in process**: `core.pull(ids)` and `core.push(ids, grads, "
        "None, meta)` on the same core built by ps/build.py, no Ray. **raw torch**: "
        "`index_select` per table for a pull; for a push, row-wise Adagrad written by hand: "
        "rows and state gathered (`index_select`), state += mean(g²), rows -= lr g / "
        "(sqrt(state) + eps), both written back (`index_copy_`): the torch ops of the store's "
        "rule without the store around them; **raw index_add_**: one `index_add_` of the "
        "gradients per table (SGD, no state), as the issue's first probe measured a push. "
        "Every path's tables are fully touched. The in-process paths ran after the Ray "
        f"instance was shut down, with {facts['torch_threads']} torch thread(s), as many as "
        f"the shard's process has. The machine's 1-minute load average before the run: {load:.2f}. "
        f"Scenario wall time {wall_s / 60:.1f} min.")
    sat = saturation or {}
    return {
        "scenario": "ps", "description": description + sat.get("description", ""),
        "arms": {**arms, **sat.get("arms", {})}, "ratios": {**ratios, **sat.get("ratios", {})},
        "points": points, "wall_s": wall_s, "curve": sat.get("curve"), "probe": sat.get("probe"),
        "emulation_label": sat.get("emulation_label"), "configs": sat.get("configs", {}),
        "tables": {"The run": [
            ["table rows", rows, f"{NUM_TABLES} tables x dim {DIM} (x --scale)"],
            ["timed calls per point", calls, f"after {WARMUP_CALLS} warm-up calls; medians"],
            ["torch threads", facts["torch_threads"],
             "the shard's process (Ray's); the in-process paths used as many"],
            ["Ray call without arrays (ms)", facts["noop_ms"],
             "PSShard.where round trip, median: Ray's fixed cost per call"],
            ["direct call without rows (ms)", facts.get("direct_noop_ms"),
             "a pull of no ids over the direct path, median: its fixed cost per call"],
            ["Ray version", facts["ray"], "the embedded instance (loopback, no dashboard)"],
            ["1-minute load average before", load, "the machine should be idle"],
        ], **shard_cpu_table(at, facts), **sat.get("tables", {})},
    }


def shard_cpu_table(at: dict, facts: dict) -> dict:
    """The shard process's CPU per call on the direct path beside the call's wall time: what
    a shard serving many workers spends on each of their calls (docs/simulate.md's model of
    a shard's service reads it); {} where it was not read."""
    rows = [[f"{op}, {n:,} ids per table", p["shard_cpu_ms_per_call"], p["ms_per_call"]]
            for op in ("pull", "push") for n in IDS_PER_TABLE
            if (p := at.get((WORKER_PATH, op, n))) and p.get("shard_cpu_ms_per_call") is not None]
    if facts.get("direct_noop_shard_cpu_ms") is not None:
        rows.insert(0, ["pull of no ids", facts["direct_noop_shard_cpu_ms"],
                        facts["direct_noop_ms"]])
    return {"The shard's CPU per call on the direct path (ms: every thread of its process, "
            "from /proc; beside the call's wall time, ms)": rows} if rows else {}
