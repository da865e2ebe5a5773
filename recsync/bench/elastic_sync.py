"""Scenario `elastic`, its sync part: a sync run whose group goes 4 -> 2 -> 4 workers
(``cluster.workers = [2, 4]``, `recsync scale` at a third and two thirds of the samples) against
a fixed run of 4 workers, on the same data, seeds 0..``SEEDS - 1``: the eval AUC of the scaled
run within 0.003 of the fixed one's is issue 34's check that forming the group again (the same
global batch, split between fewer workers; nothing trained twice) leaves the model as a fixed
run trains it. Not emulated: only the model is compared, and how long a formation paused the
workers."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from recsync.config import load_config

SEEDS = 3
BATCH = 512
ARMS = {"sync_fixed_4w": ["cluster.workers=4"], "sync_scaled": ["cluster.workers=[2, 4]"]}
COMMON = ['mode="sync"', "cluster.ps_shards=1", f"train.batch_size={BATCH}",
          "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]", f"data.chunk_rows={4 * BATCH}",
          "train.threads=1", "output.progress=false", "output.plot=false",
          "train.eval_every_samples=1000000000000"]


def run_sync_quality(out: Path, data: Path, rows: int, run_scaled) -> dict:
    """The two arms for each seed, interleaved, on the scenario's ``data`` (``rows`` training
    rows: the last phase must outlast a new worker's start-up); ``run_scaled(cfg, run_dir,
    rows)``: the scenario's run of an arm, scaled as its phases say (its summary). Returns the
    arms and the ratios."""
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    for seed in range(SEEDS):
        for name, extra in ARMS.items():
            cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *extra,
                                     f"train.seed={seed}"])
            summary = run_scaled(cfg, out / f"seed{seed}" / name, rows)
            e = summary.get("elastic") or {}
            formations = e.get("formations") or []
            runs[name].append({
                "seed": seed, "status": summary["status"], "auc": summary["eval"]["auc"],
                "samples": summary["samples"], "samples_per_s": summary["samples_per_s"],
                "released_rows": summary["queue"]["released_rows"],
                "group_sizes": [len(f["members"]) for f in formations],
                "pause_s": [f["pause_s"] for f in formations[1:]]})
    diffs = [s["auc"] - f["auc"] for s, f in zip(runs["sync_scaled"], runs["sync_fixed_4w"])]
    sizes = [r["group_sizes"] for r in runs["sync_scaled"]]
    pauses = [p for r in runs["sync_scaled"] for p in r["pause_s"]]
    return {
        "rows": rows, "seeds": SEEDS, "runs": runs,
        "auc_differences": diffs,
        "fixed_auc_spread": (max(r["auc"] for r in runs["sync_fixed_4w"])
                             - min(r["auc"] for r in runs["sync_fixed_4w"])),
        "ratios": {
            "scaled_sync_minus_fixed_auc": statistics.mean(diffs),
            "scaled_sync_scaled_as_asked": all(went_through(s, [4, 2, 4]) for s in sizes),
            "sync_formation_pause_s": max(pauses) if pauses else None,
        },
        "text": (f"sync, {rows:,} rows, batch {BATCH} x 4 workers a step (the scaled run's "
                 f"global batch too), 1 shard, not emulated; seeds 0-{SEEDS - 1}: eval AUC "
                 f"scaled - fixed {', '.join(f'{d:+.4f}' for d in diffs)} (mean "
                 f"{statistics.mean(diffs):+.4f}); the scaled runs' group sizes {sizes}; "
                 f"formations paused the workers {', '.join(f'{p:.2f}' for p in pauses)} s"),
    }


def went_through(sizes: list[int], wanted: list[int]) -> bool:
    """Whether the group's sizes, in order, reached each of ``wanted`` in turn (new workers
    are built one by one: 2 -> 4 may pass through 3)."""
    it = iter(sizes)
    return all(any(n == w for n in it) for w in wanted)
