"""`recsync bench sizing`: the memory to plan a cluster with, measured (docs/cluster.md).

- **A PS shard per million rows, per dim.** In a process of its own (so that nothing else moves
  its RSS), an ``EmbeddingStore`` of one table is built, every row is pulled and pushed
  (touched: weights and optimizer state allocated and written), then a checkpoint's copy of
  every row is taken. RSS is read before, after touching and while the copy is held, at 1M and
  2M rows (x ``--scale``): the slope is MB per million touched rows (and what a checkpoint adds
  while it is written), the rest a fixed cost. Dims 8, 16, 32, 64 with row-wise Adagrad (the
  default) and SGD.
- **A worker and a shard process in a run.** A distributed run (mode async, 2 workers, 2 shards,
  DLRM defaults, batch 4096, synthetic data with tables of up to 100k rows) sampled by
  ``RssSampler``: each role's peak RSS. A worker's memory does not grow with the tables: it
  holds a batch's rows only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from recsync.bench.report import _table

DIMS = (8, 16, 32, 64)
OPTIMIZERS = ("adagrad", "sgd")
ROWS = 1_000_000
MB = 2**20


def store_rss(dim: int, rows: int, optimizer: str) -> dict:
    """In this process: RSS (bytes) of an EmbeddingStore before, after touching every row, and
    while a copy of every row (a checkpoint's) is held."""
    import ray  # noqa: F401 - first: it puts the psutil it bundles on sys.path
    import psutil
    import torch

    from recsync.embedding.row_optim import make_row_optimizer
    from recsync.embedding.spec import TableSpec
    from recsync.embedding.store import EmbeddingStore
    proc = psutil.Process()
    torch.set_num_threads(1)
    grads = torch.full((65536, dim), 1e-3)
    before = proc.memory_info().rss
    store = EmbeddingStore([TableSpec("t", rows, dim)], make_row_optimizer(optimizer, 0.01))
    for ids in torch.arange(rows).split(65536):
        store.pull(0, ids)
        store.push(0, ids, grads[:len(ids)])
    touched = proc.memory_info().rss
    snapshot = store.snapshot()
    copied = proc.memory_info().rss
    assert len(snapshot["t0.local"]) == rows
    return {"before": before, "touched": touched, "copied": copied}


def _measure_store(dim: int, rows: int, optimizer: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "recsync.bench.sizing", str(dim), str(rows),
                          optimizer], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"measuring a store of {rows:,} rows of dim {dim} ({optimizer}) "
                           f"failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_memory(out: Path, scale: float) -> dict:
    import recsync
    from recsync.bench.memory import RssSampler
    from recsync.data.synthetic import generate
    data = out / "data"
    generate(data, rows=int(400_000 * scale), processes=1, overwrite=True, progress=False)
    cfg = recsync.override(recsync.load_config(), **{
        "data.path": str(data), "mode": "async", "cluster.workers": 2, "cluster.ps_shards": 2,
        "train.batch_size": 4096, "train.epochs": 1, "output.progress": False,
        "output.plot": False})
    with RssSampler() as sampler:
        r = recsync.train(cfg, out / "run", overwrite=True)
    mem = sampler.result()
    tables = json.loads((data / "meta.json").read_text())["tables"]
    return {"summary": r.summary, "memory": mem, "config": cfg.to_toml(),
            "table_rows": sum(t["rows"] for t in tables)}


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    rows = max(10_000, int(ROWS * scale))
    per_million: dict[str, dict] = {}
    rows_table = []
    for optimizer in OPTIMIZERS:
        for dim in DIMS:  # the slope between rows and 2 x rows: fixed costs cancel
            small, large = (_measure_store(dim, n, optimizer) for n in (rows, 2 * rows))
            grown = [(m["touched"] - m["before"], m["copied"] - m["touched"])
                     for m in (small, large)]
            touched = (grown[1][0] - grown[0][0]) / MB * 1e6 / rows
            copy = (grown[1][1] - grown[0][1]) / MB * 1e6 / rows
            fixed = grown[0][0] / MB - touched * rows / 1e6
            per_million[f"{optimizer}_dim{dim}"] = {"mb_per_million_rows": touched,
                                                    "checkpoint_copy_mb": copy,
                                                    "fixed_mb": fixed}
            rows_table.append([optimizer, dim, f"{touched:,.1f}", f"{copy:,.1f}",
                               f"{fixed:,.0f}",
                               f"{(4 * (dim + (optimizer == 'adagrad')) + 1) * 1e6 / MB:,.1f}"])
    job = _run_memory(out, scale)
    mem, summary = job["memory"], job["summary"]
    arms = {"async_2x2": {"samples_per_s": summary["samples_per_s"], "eval": summary["eval"],
                          "memory": mem}}
    ratios = {f"shard_mb_per_million_rows_{k}": v["mb_per_million_rows"]
              for k, v in per_million.items()}
    ratios.update({f"checkpoint_copy_mb_per_million_rows_{k}": v["checkpoint_copy_mb"]
                   for k, v in per_million.items()})
    ratios["worker_peak_rss_mb"] = (mem["worker_peak_rss"] or 0) / MB
    ratios["ps_shard_peak_rss_mb"] = (mem["ps_shard_peak_rss"] or 0) / MB
    wall_s = time.perf_counter() - started
    return {
        "scenario": "sizing",
        "description": (
            f"Memory per PS shard per million touched rows: one table in a process of its "
            f"own, RSS after touching every row minus before building the store, measured at "
            f"{rows:,} and {2 * rows:,} rows; the slope between the two is the cost per row, "
            f"the rest is fixed (torch's first allocations). The same for what a checkpoint's "
            f"copy of every row adds while it is held. Then one run (mode async, 2 workers, "
            f"2 shards, batch 4096, DLRM defaults, "
            f"{job['table_rows']:,} table rows in all) sampled every 0.5 s: each role's peak "
            f"RSS (shared pages such as torch's libraries counted in each process). Scenario "
            f"wall time {wall_s / 60:.1f} min.\n\n## Per million rows\n\n"
            + _table(["row optimizer", "dim", "MB per million rows (measured)",
                      "checkpoint copy, MB per million rows (measured)",
                      "fixed MB (measured)", "arithmetic: 4 x (dim + state) + 1 bytes, MB"],
                     rows_table)
            + "\n\n## Processes of a run (peak RSS, MB)\n\n"
            + _table(["role", "processes", "peak RSS of one (MB)"],
                     [[role, d["processes"], f"{d['max_peak_rss'] / MB:,.0f}"]
                      for role, d in sorted(mem["by_role"].items())])),
        "arms": arms, "ratios": ratios, "per_million_rows": per_million, "wall_s": wall_s,
        "configs": {"the run": job["config"]},
    }


if __name__ == "__main__":  # one store measurement, in a process of its own
    print(json.dumps(store_rss(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])))
