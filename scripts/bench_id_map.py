"""Micro-benchmark of IdMap (issue 33): find and insert+find of 2,048 unique ids per table,
26 tables of capacity 1M at load ~0.5, against torch.index_select of the same 53k rows x 16
(the gather a fixed-table pull already pays).

    PYTHONPATH=. python scripts/bench_id_map.py [--tables 26] [--capacity 1048576] [--repeat 30]

Prints medians in ms. Single process, no Ray.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from recsync.embedding.id_map import IdMap


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=26)
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)
    maps, batches = [], []
    for _ in range(args.tables):
        m = IdMap(args.capacity)
        ids = np.unique(rng.integers(-2**63, 2**63 - 1, args.capacity // 2, dtype=np.int64))
        ids = ids[ids != 0]
        m.insert(ids)
        maps.append(m)
        # half of each batch live, half absent: what a pull with new ids looks like
        new = rng.integers(-2**63, 2**63 - 1, args.batch // 2, dtype=np.int64)
        batches.append(np.concatenate([rng.choice(ids, args.batch // 2, replace=False), new]))
    per = args.repeat

    def find_all():
        for m, b in zip(maps, batches):
            m.find(b)

    def insert_find_remove():
        # insert the absent half, find all, then undo, so every repeat starts alike
        for m, b in zip(maps, batches):
            slots = m.find(b)
            new = m.insert(b[slots < 0])
            m.find(b)
            m.remove(new)

    def touch_all():
        for m, b in zip(maps, batches):
            m.touch(m.find(b[: args.batch // 2]), 1)

    table = torch.randn(args.capacity, 16)
    rows = torch.from_numpy(rng.integers(0, args.capacity, args.tables * args.batch))
    n = args.tables
    print(f"{n} tables x {args.batch} ids, capacity {args.capacity}, load "
          f"{len(maps[0]) / args.capacity:.2f}, bytes/row {IdMap.bytes_per_row(args.capacity):.2f}")
    print(f"find, all tables:                {median_ms(find_all, per):7.2f} ms "
          f"({median_ms(find_all, per) / n:.3f} ms per table)")
    t = median_ms(insert_find_remove, per)
    print(f"find+insert+find+remove, all:    {t:7.2f} ms ({t / n:.3f} ms per table)")
    t = median_ms(touch_all, per)
    print(f"find+touch 1,024, all tables:    {t:7.2f} ms ({t / n:.3f} ms per table)")
    t = median_ms(lambda: torch.index_select(table, 0, rows), per)
    print(f"index_select {len(rows)} x 16 of 1M: {t:7.2f} ms")
    t = median_ms(lambda: maps[0].lowest(2048, "lfu"), 5)
    print(f"lowest(2048, lfu), one table:    {t:7.2f} ms")


if __name__ == "__main__":
    main()
