"""Scenario `dynamic`'s store measurements: bytes per row and pull / push rows/s of a dynamic
table against a fixed one, measured on the real objects.

Bytes per row (dim 16, row-wise Adagrad): an EmbeddingStore with one table. Dynamic: its
weights', state's and live mask's ``nbytes``, ``IdMap.nbytes`` and the admission sketch's, per
capacity row (what a full table holds; the tensors are allocated for the capacity). Fixed: its
weights', state's and ``initialized``'s ``nbytes`` per row (a touched row's cost).

Pull and push: ShardCore in this process, built as a run builds it (ps/build.py: mode async,
row-wise Adagrad), 26 tables of ``rows`` rows x 16, fixed and dynamic (capacity ``rows``), every
row already held (the steady state: no initialisation, admission or eviction while timed); each
call 2,048 unique sorted ids per table (a dynamic table's: random 64-bit ids it holds); the two
cores alternate call by call; medians. rows/s = 26 x 2,048 / seconds per call.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from recsync.bench.ps import DIM, NUM_TABLES, PUSH_META, point, shard_config
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import DynamicSpec, TableSpec
from recsync.embedding.store import EmbeddingStore

IDS_PER_TABLE = 2048
TOUCH_IDS = 65_536  # ids per table of each pull that fills the tables before timing


def bytes_per_row(rows: int, *, dynamic: bool, admit_after: int = 1, dim: int = DIM) -> dict:
    """Bytes per row of a store with one table of ``rows`` rows (capacity, if ``dynamic``) at
    ``dim`` with row-wise Adagrad, from the objects' arrays; and each part's."""
    spec = TableSpec("t", rows, dim,
                     dynamic=DynamicSpec(rows, admit_after=admit_after) if dynamic else None)
    store = EmbeddingStore([spec], make_row_optimizer("adagrad", 0.05))
    parts = {"weights": store.weights[0].nbytes, "state": store.state[0].nbytes,
             "flags": store.initialized[0].nbytes}  # the live mask of a dynamic table
    if dynamic:
        table = store.dynamic[0]
        parts.update(id_map=table.map.nbytes, admission=table.admission.nbytes)
    return {"rows": rows, "bytes_per_row": sum(parts.values()) / rows,
            "parts_per_row": {k: v / rows for k, v in parts.items()}}


def equal_memory_capacity(rows: int) -> tuple[int, dict, dict]:
    """The capacity whose dynamic table holds as many bytes as a fixed table of ``rows`` rows,
    by the measured bytes per row (the map's share depends a little on the capacity, so it is
    measured again there); and both measurements."""
    fixed = bytes_per_row(rows, dynamic=False)
    capacity = int(rows * fixed["bytes_per_row"] / bytes_per_row(rows, dynamic=True)[
        "bytes_per_row"])
    return capacity, fixed, bytes_per_row(capacity, dynamic=True)


def held_cores(rows: int):
    """A fixed and a dynamic ShardCore (26 tables, ``rows`` rows or capacity each) with every
    row held, and the ids each holds per table (sorted int64)."""
    from recsync.ps.build import make_core
    cfg = shard_config()
    fixed_tables = [TableSpec(f"t{t}", rows, DIM) for t in range(NUM_TABLES)]
    dyn_tables = [TableSpec(f"t{t}", rows, DIM, dynamic=DynamicSpec(rows))
                  for t in range(NUM_TABLES)]
    rng = np.random.default_rng(0)
    held = {"fixed": [np.arange(rows, dtype=np.int64)] * NUM_TABLES,
            "dynamic": [np.unique(rng.integers(1, 2**63 - 1, rows, dtype=np.int64))
                        for _ in range(NUM_TABLES)]}
    cores = {}
    for kind, tables in (("fixed", fixed_tables), ("dynamic", dyn_tables)):
        core = make_core(tables, cfg, 0, None)
        longest = max(len(h) for h in held[kind])
        for start in range(0, longest, TOUCH_IDS):
            core.pull([h[start:start + TOUCH_IDS] for h in held[kind]])
        cores[kind] = core
    for t, table in cores["dynamic"].store.dynamic.items():
        assert len(table.map) == len(held["dynamic"][t]), "every id must hold a row"
    return cores, held


def pull_push(rows: int, calls: int, warmup: int = 3) -> dict:
    """Median rows/s of pull and push, fixed and dynamic alternating call by call (module
    docstring); the points as bench/ps.py's ``point`` makes them."""
    cores, held = held_cores(rows)
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((IDS_PER_TABLE, DIM), dtype=np.float32) * np.float32(1e-2)
             for _ in range(NUM_TABLES)]
    times = {(kind, op): [] for kind in cores for op in ("pull", "push")}
    for k in range(warmup + calls):
        picks = [np.sort(rng.choice(rows, IDS_PER_TABLE, replace=False))
                 for _ in range(NUM_TABLES)]
        for kind, core in cores.items():
            ids = [h[p] for h, p in zip(held[kind], picks)]
            for op in ("pull", "push"):
                begin = time.perf_counter()
                if op == "pull":
                    core.pull(ids)
                else:
                    core.push(ids, grads, None, dict(PUSH_META))
                if k >= warmup:
                    times[(kind, op)].append(time.perf_counter() - begin)
    dropped = sum(t.counts["dropped_grads"] + t.counts["evicted"]
                  for t in cores["dynamic"].store.dynamic.values())
    assert dropped == 0, "the steady state admits, evicts and drops nothing"
    points = {f"{kind}_{op}": point(kind, op, IDS_PER_TABLE, ts) for (kind, op), ts in
              times.items()}
    return {"rows": rows, "calls": calls, "torch_threads": torch.get_num_threads(),
            "points": points,
            "dynamic_vs_fixed_pull": (points["dynamic_pull"]["rows_per_s"]
                                      / points["fixed_pull"]["rows_per_s"]),
            "dynamic_vs_fixed_push": (points["dynamic_push"]["rows_per_s"]
                                      / points["fixed_push"]["rows_per_s"])}
