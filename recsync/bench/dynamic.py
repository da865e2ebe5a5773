"""Scenario `dynamic`: dynamic embedding tables against fixed ones (issue 33's acceptance).

One synthetic data set whose teacher has up to ``10 x R`` ids per table (``SynthSpec
(max_table_rows=10 R)``, R = ``TABLE_ROWS`` x ``--scale``), its ids rewritten three ways
(dynamic_data.py): FIXED tables of R rows (``1 + splitmix64(id) % (R - 1)``, as a conversion
hashes), DYNAMIC tables (``splitmix64(id)`` as int64) and a DRIFT stream of dynamic tables whose
ids change every segment of the train split (the eval split: the last segment's). The same rows,
labels and teacher in all three.

Arms, local runs of the default DLRM, batch 4,096, dim 16, row-wise Adagrad, one intra-op
thread, once per seed (``--seeds``, default 3; arms interleaved within a seed); fixed and dynamic
as ``run.run`` in this process (overhead.run_arm), the drift arms each as ``recsync train`` in a
process of its own (its memory sampled, dynamic_drift.py):

- ``fixed``: the FIXED data set, tables of R rows;
- ``dynamic``: the DYNAMIC data set, ``model.dynamic.capacity`` C with C x (bytes per dynamic
  row) = R x (bytes per fixed row), both measured (dynamic_store.py): the same memory;
- ``drift_lfu`` and ``drift_lru``: the DRIFT stream in order (``data.shuffle = false``),
  capacity C (below the ids seen), eviction LFU (the default) and LRU;
- ``drift_unbounded``: the same with a capacity above every id of the stream (no eviction).

Ratios: ``dynamic_minus_fixed_auc`` (dynamic - fixed), ``drift_minus_unbounded_auc``
(drift_lfu - drift_unbounded; ``drift_lru_minus_unbounded_auc`` the same with LRU): means of the
per-seed differences of eval AUC; ``drift_anon_rss_growth_after_full_mb`` and
``unbounded_anon_rss_growth_after_full_mb``: the training process's anonymous RSS growth from
where drift_lfu's tables are full to the end of training, mean of seeds (dynamic_drift.py);
``bytes_per_row_vs_fixed``: a dynamic row's bytes (capacity 1M, admit_after 1) over a fixed
touched row's; ``dynamic_vs_fixed_pull`` / ``_push``: rows/s of ShardCore with 26 dynamic tables
over 26 fixed ones; ``collisions_dynamic``: distinct values less distinct ids over every shared
sample with dynamic tables (None without ../shared/data).

Every arm evaluates with ``train.eval_batch_size`` = the batch size (evaluations only read a
dynamic table: ids without a row score with zeros). Then, measured on the objects: bytes per row,
pull and push rows/s of a dynamic table against a fixed one (dynamic_store.py; the issue asks
for them "in bench ps"), and the collisions of the shared samples with dynamic tables.
"""

from __future__ import annotations

import time
from pathlib import Path

from recsync.api import override
from recsync.bench import dynamic_data as dd
from recsync.bench import dynamic_drift as dr
from recsync.bench import dynamic_store as ds
from recsync.bench.dynamic_report import results
from recsync.bench import seeds as sd
from recsync.config import load_config
from recsync.data.synthetic import SynthSpec, generate

TABLE_ROWS = 10_000  # R, a fixed table's rows, x --scale
TEACHER_IDS = 10  # the teacher's ids per table: up to this many times R
TRAIN_ROWS = 1_000_000  # x --scale
EVAL_ROWS = 100_000  # x --scale
SEGMENTS = 4  # of the drift stream
BATCH = 4096
PULL_PUSH_ROWS = 100_000  # per table of the pull / push cores, x --scale
PULL_PUSH_CALLS = 30
SETTINGS = [f"train.batch_size={BATCH}", f"train.eval_batch_size={BATCH}",
            "model.embedding_dim=16", 'train.embedding_optimizer="adagrad"', "train.threads=1",
            "train.eval_every_samples=1000000000000", "output.progress=false",
            "output.plot=false", "output.save_model=false", "output.log_every_steps=5"]


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    rows = max(100, round(TABLE_ROWS * scale))
    train_rows = max(20 * BATCH, round(TRAIN_ROWS * scale))
    eval_rows = max(BATCH, round(EVAL_ROWS * scale))
    data = make_data(out / "data", rows, train_rows, eval_rows)
    capacity, fixed_b, dyn_b = ds.equal_memory_capacity(rows)
    print(f"capacity {capacity:,}: {dyn_b['bytes_per_row']:.1f} bytes per dynamic row, "
          f"{fixed_b['bytes_per_row']:.1f} per fixed one, x {rows:,} rows", flush=True)
    base = load_config(None, SETTINGS)

    def config(name: str, **keys):
        return override(base, **{"data.path": str(data[name]), **keys})

    arms_cfg = {"fixed": config("fixed"),
                "dynamic": config("dynamic", **{"model.dynamic.capacity": capacity})}
    runs = sd.seeded_runs(list(arms_cfg), arms_cfg.__getitem__, out, seeds)

    counts = dd.id_counts(data["drift"])
    unbounded = max(counts["all"]) + 1
    drift = {name: config("drift", **{"data.shuffle": False, "model.dynamic.capacity": cap,
                                      "model.dynamic.eviction": policy})
             for name, cap, policy in (("drift_lfu", capacity, "lfu"),
                                       ("drift_lru", capacity, "lru"),
                                       ("drift_unbounded", unbounded, "lfu"))}
    full_at = dr.full_row(counts["first_seen"], capacity)
    expected = {n: None if full_at is None else  # what the tables take after full_at, MB
                dr.rows_after(counts["first_seen"], full_at, cfg.model.dynamic.capacity)
                * dyn_b["bytes_per_row"] / dr.MB for n, cfg in drift.items()}
    drift_runs = dr.drift_runs(drift, out, seeds, full_at)

    print("pull and push: fixed and dynamic ShardCore, 26 tables ...", flush=True)
    pp = ds.pull_push(max(4 * ds.IDS_PER_TABLE, round(PULL_PUSH_ROWS * scale)),
                      PULL_PUSH_CALLS)
    bytes_1m = {kind: ds.bytes_per_row(1_000_000, dynamic=kind != "fixed",
                                       admit_after=2 if kind == "dynamic_sketch" else 1)
                for kind in ("fixed", "dynamic", "dynamic_sketch")}
    print("collisions on the shared samples ...", flush=True)
    collisions = dd.shared_collisions()

    arms = {n: sd.seeded_entry(r) for n, r in runs.items()}
    arms.update({n: dr.drift_entry(r) for n, r in drift_runs.items()})
    diffs = {"dynamic - fixed": sd.auc_difference(arms, "dynamic", "fixed"),
             "drift_lfu - drift_unbounded": sd.auc_difference(arms, "drift_lfu",
                                                              "drift_unbounded"),
             "drift_lru - drift_unbounded": sd.auc_difference(arms, "drift_lru",
                                                              "drift_unbounded")}
    growth = {n: _mean([g for g in arms[n]["anon_growth_after_full_mb_seeds"] if g is not None])
              for n in drift}
    ratios = {
        "dynamic_minus_fixed_auc": diffs["dynamic - fixed"]["mean"],
        "drift_minus_unbounded_auc": diffs["drift_lfu - drift_unbounded"]["mean"],
        "drift_lru_minus_unbounded_auc": diffs["drift_lru - drift_unbounded"]["mean"],
        "bytes_per_row_vs_fixed": (bytes_1m["dynamic"]["bytes_per_row"]
                                   / bytes_1m["fixed"]["bytes_per_row"]),
        "dynamic_vs_fixed_pull": pp["dynamic_vs_fixed_pull"],
        "dynamic_vs_fixed_push": pp["dynamic_vs_fixed_push"],
        "collisions_dynamic": (None if collisions is None
                               else sum(c["dynamic"] for c in collisions.values())),
        "drift_anon_rss_growth_after_full_mb": growth["drift_lfu"],
        "unbounded_anon_rss_growth_after_full_mb": growth["drift_unbounded"],
    }
    facts = {"rows": rows, "teacher_ids_max": TEACHER_IDS * rows, "capacity": capacity,
             "unbounded_capacity": unbounded, "train_rows": train_rows, "eval_rows": eval_rows,
             "segments": SEGMENTS, "distinct_ids": {
                 k: dd.id_counts(data[k])["train"] for k in ("fixed", "dynamic")},
             "drift_distinct_ids": {"train": counts["train"], "all": counts["all"]},
             "full_at_row": full_at, "expected_table_growth_after_full_mb": expected,
             "bytes_per_row": {"fixed_at_R": fixed_b,
                                                       "dynamic_at_C": dyn_b, **bytes_1m}}
    return results(arms=arms, ratios=ratios, diffs=diffs, facts=facts, pull_push=pp,
                   collisions=collisions, seeds=seeds,
                   configs={**arms_cfg, **drift}, wall_s=time.perf_counter() - started)


def make_data(root: Path, rows: int, train_rows: int, eval_rows: int) -> dict[str, Path]:
    """The synthetic data set (teacher up to ``TEACHER_IDS x rows`` ids per table) and the
    three derived from it: fixed, dynamic, drift."""
    print(f"generating {train_rows:,} + {eval_rows:,} synthetic rows (tables up to "
          f"{TEACHER_IDS * rows:,} ids) ...", flush=True)
    generate(root / "teacher", rows=train_rows, eval_rows=eval_rows, overwrite=True,
             progress=False, spec=SynthSpec(max_table_rows=TEACHER_IDS * rows))
    print("deriving the fixed, dynamic and drift data sets ...", flush=True)
    return {"fixed": dd.derive(root / "teacher", root / "fixed", rows=rows),
            "dynamic": dd.derive(root / "teacher", root / "dynamic", rows=rows, dynamic=True),
            "drift": dd.derive(root / "teacher", root / "drift", rows=rows, dynamic=True,
                               segments=SEGMENTS)}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None

