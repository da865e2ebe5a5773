"""Micro-benchmark of IdMap and Admission (issue 33): per call on 2,048 unique ids per table,
tables of capacity 1M at load ~0.5 (--load; half of each batch live, half new), against
torch.index_select of the same rows x 16 from a 1M x 16 table (the gather a fixed-table pull
already pays).

    PYTHONPATH=. python scripts/bench_id_map.py [--tables 26] [--capacity 1048576] [--load 0.5]

Prints medians over repeats, ms per table (each repeat runs every table once, so the maps are
not all in cache). Single process, no Ray.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from recsync.embedding.admission import Admission
from recsync.embedding.id_map import IdMap


def per_table_ms(fn, maps, repeat: int, undo=None, prepare=None) -> float:
    """Median over repeats of (time of fn on every table) / tables. Not timed: ``prepare(i)``
    makes fn's argument, ``undo(i, result)`` puts table i back as it was."""
    times = []
    for _ in range(repeat):
        took = 0.0
        for i in range(len(maps)):
            args = (prepare(i),) if prepare else ()
            t0 = time.perf_counter()
            result = fn(i, *args)
            took += time.perf_counter() - t0
            if undo is not None:
                undo(i, result)
        times.append(took)
    return 1e3 * float(np.median(times)) / len(maps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=26)
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--load", type=float, default=0.5, help="live / capacity before a call")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)
    half = args.batch // 2
    maps, batches, news, adms = [], [], [], []
    for _ in range(args.tables):
        m = IdMap(args.capacity)
        live = min(int(args.load * args.capacity), args.capacity - args.batch)
        ids = np.unique(rng.integers(-2**63, 2**63 - 1, live, dtype=np.int64))
        m.insert(ids[ids != 0])
        maps.append(m)
        new = np.unique(rng.integers(-2**63, 2**63 - 1, half, dtype=np.int64))
        news.append(new)
        batches.append(np.concatenate([rng.choice(ids, args.batch - len(new), replace=False),
                                       new]))
        adms.append(Admission(3))

    touches = [rng.choice(m.live_slots(), args.batch, replace=False) for m in maps]

    def find_insert_find(i):
        """A pull with new ids: find, insert the absent ones, find again (or use the slots)."""
        m, b = maps[i], batches[i]
        slots = m.find(b)
        new = m.insert(b[slots < 0])
        m.find(b)
        return new

    def remove(i, new):  # not timed: every repeat starts alike
        maps[i].remove(new)

    r, n = args.repeat, args.tables
    print(f"{n} tables x {args.batch} ids, capacity {args.capacity}, load "
          f"{len(maps[0]) / args.capacity:.2f}, IdMap bytes/row "
          f"{IdMap.bytes_per_row(args.capacity):.2f}, ms per table (median of {r})")
    rows = [
        ("find 2,048 (half present)", lambda i: maps[i].find(batches[i]), None, None),
        (f"insert {half} new ids", lambda i: maps[i].insert(news[i]), remove, None),
        (f"remove {half} slots", lambda i, s: maps[i].remove(s), None,
         lambda i: maps[i].insert(news[i])),
        (f"find + insert {half} + find", find_insert_find, remove, None),
        ("touch 2,048 live slots", lambda i: maps[i].touch(touches[i], 1), None, None),
        (f"admit {half} new ids (sketch 1M x 4)", lambda i: adms[i].admit(news[i]), None,
         None),
    ]
    for name, fn, undo, prepare in rows:
        print(f"  {name:40s} {per_table_ms(fn, maps, r, undo, prepare):7.3f}")
    table = torch.randn(args.capacity, 16)
    idx = torch.from_numpy(rng.integers(0, args.capacity, args.batch))
    print(f"  {'index_select 2,048 x 16 of 1M x 16':40s} "
          f"{per_table_ms(lambda i: torch.index_select(table, 0, idx), maps, r):7.3f}")
    allrows = torch.from_numpy(rng.integers(0, args.capacity, n * args.batch))
    t = per_table_ms(lambda i: torch.index_select(table, 0, allrows), [0], r)
    print(f"  index_select {len(allrows)} x 16 of 1M x 16, one call: {t:.3f} ms")
    # sightings with a Zipf-like skew over 1,000 steps, so scores spread as in a run
    m = maps[0]
    live = m.live_slots()
    for step in range(1000):
        m.touch(live[np.minimum(rng.zipf(1.2, args.batch), len(live)) - 1], step)
    for policy in ("lfu", "lru"):
        t = per_table_ms(lambda i: m.lowest(args.batch, policy), [m], 5)
        print(f"  lowest({args.batch}, {policy}) of {len(m)} live, one table: {t:.2f} ms")
    t = per_table_ms(lambda i: maps[i].idle(1), maps[:1], 5)
    print(f"  idle(before) scan, one table: {t:.2f} ms")


if __name__ == "__main__":
    main()
