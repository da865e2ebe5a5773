"""Scenario `stragglers`: sync, async and gba on the same data with one emulated 4x straggler.

N = 4 workers, S = 2 PS shards, one pass over the same synthetic data in every arm, the same
model and hyper-parameters in every arm: those of mode sync (row-wise Adagrad on rows, Adagrad
on dense parameters, the project's defaults, which are tuned for a batch of 4096 samples =
4 workers x 1024), never retuned for async or gba.

Arms:
- ``sync``, ``async``, ``gba``: worker 0 runs 4x slower throughout (emulated: between computing
  each step and sending it, it sleeps 3x that step's compute time);
- ``sync_nostraggler``, ``gba_nostraggler``: no straggler;
- ``gba_threshold_1``: gba with the straggler and staleness threshold 1 instead of the default
  4, so that the straggler's gradients are decayed: the evidence for the default.

Ratios: ``gba_vs_sync_speed`` (training samples/s after a warm-up, from the metrics logs, as in
scenario `overhead`), ``gba_minus_sync_auc``, ``gba_minus_sync_auc_nostraggler``,
``async_minus_sync_auc`` (eval AUC on the whole eval split at the end of each run), and
``ideal_speed_ratio``: the sum of the workers' speeds over N x the slowest, from the emulated
slow-down factors (3.25 here: GBA's ceiling if every worker kept its own pace).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from recsync.bench import overhead as ov
from recsync.config import RunConfig, load_config
from recsync.data.synthetic import SynthSpec
from recsync.plot import plot_runs

WORKERS, SHARDS, BATCH = 4, 2, 1024
FACTOR = 4.0
CHUNK_BATCHES = 4  # small chunks: the run ends with the straggler's last chunk, 4x slow
ROWS = 1_500_000  # training rows at --scale 1
EVAL_ROWS = 200_000
COMMON = [  # every arm adds its mode
    f"cluster.workers={WORKERS}", f"cluster.ps_shards={SHARDS}",
    f"train.batch_size={BATCH}", "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]",
    f"data.chunk_rows={CHUNK_BATCHES * BATCH}",
    "train.threads=1", "output.progress=false", "output.plot=false", "output.log_every_steps=1",
    "train.eval_every_samples=1000000000000",  # only the final evaluation: throughput arms
]
STRAGGLER = f"faults.stragglers=[{{ worker = 0, factor = {FACTOR} }}]"
ARMS = {
    "sync": ['mode="sync"', STRAGGLER],
    "async": ['mode="async"', STRAGGLER],
    "gba": ['mode="gba"', STRAGGLER],
    "sync_nostraggler": ['mode="sync"'],
    "gba_nostraggler": ['mode="gba"'],
    # evidence for the default threshold (4): decaying the straggler's gradients instead
    "gba_threshold_1": ['mode="gba"', STRAGGLER, "gba.staleness_threshold=1"],
}


def ideal_speed_ratio(factors: list[float]) -> float:
    """Σ speeds / (N x slowest speed), a worker's speed being 1 / its slow-down factor."""
    speeds = [1.0 / f for f in factors]
    return sum(speeds) / (len(speeds) * min(speeds))


def make_data(path: Path, rows: int) -> Path:
    """The default synthetic set (SynthSpec()), with EVAL_ROWS eval rows."""
    return ov.make_data(path, rows, SynthSpec().max_table_rows, EVAL_ROWS)


def arm_config(data: Path, extra: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *extra])


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    data = make_data(out / "data", max(200_000, round(ROWS * scale)))
    cfgs = {name: arm_config(data, extra) for name, extra in ARMS.items()}
    arms = {}
    for name, cfg in cfgs.items():
        print(f"{name} ...", flush=True)
        arms[name] = ov.run_arm(cfg, out / "arms" / name, name)
        print(f"  eval AUC {arms[name]['eval']['auc']:.4f}", flush=True)
    plot_runs([out / "arms" / n for n in arms], out / "quality.png", labels=list(arms))

    def auc(name):
        return arms[name]["eval"]["auc"]

    ratios = {
        "gba_vs_sync_speed": arms["gba"]["samples_per_s"] / arms["sync"]["samples_per_s"],
        "gba_minus_sync_auc": auc("gba") - auc("sync"),
        "gba_minus_sync_auc_nostraggler": auc("gba_nostraggler") - auc("sync_nostraggler"),
        "async_minus_sync_auc": auc("async") - auc("sync"),
        "ideal_speed_ratio": ideal_speed_ratio([FACTOR] + [1.0] * (WORKERS - 1)),
    }
    ratios["gba_speed_vs_ideal"] = ratios["gba_vs_sync_speed"] / ratios["ideal_speed_ratio"]
    ratios["gba_threshold_1_minus_gba_auc"] = auc("gba_threshold_1") - auc("gba")
    summary_ratio = arms["gba"]["summary_samples_per_s"] / arms["sync"]["summary_samples_per_s"]
    wall_s = time.perf_counter() - started
    return {
        "scenario": "stragglers",
        "description": (
            f"{WORKERS} workers x batch {BATCH}, {SHARDS} PS shards, one pass over "
            f"{arms['sync']['samples']:,} synthetic rows in every arm; DLRM with MLPs [64, 32] "
            f"and [64, 32], the default optimizers and learning rates (those of sync) in every "
            f"arm; chunks of {CHUNK_BATCHES} batches. The straggler is EMULATED: worker 0 sleeps "
            f"{FACTOR - 1:g}x its compute time between computing each step and sending it. "
            f"All processes share the machine's {os.cpu_count()} cores. samples/s counts the "
            f"steps after a warm-up of {ov.WARMUP_STEPS} steps per worker (from the metrics "
            f"logs); gba/sync from samples / train_s of summary.json: {summary_ratio:.3f}. "
            f"AUC on the whole eval split ({EVAL_ROWS:,} rows). One run per arm. Scenario wall "
            f"time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "stragglers_emulated": True,
        "wall_s": wall_s,
        "tables": {
            "Quality and speed per arm": [
                [f"{n}: eval AUC / logloss", a["eval"]["auc"],
                 f"logloss {a['eval']['logloss']:.4f}, Bayes-optimal AUC "
                 f"{a['eval']['bayes_auc']:.4f}; staleness mean "
                 + (f"{a['staleness']['mean']:.2f}, max {a['staleness']['max']}"
                    if a["staleness"]["mean"] is not None else "n/a")
                 + (f"; gba gradients applied {a['gba']['applied']}, decayed "
                    f"{a['gba']['decayed']}, dropped {a['gba']['dropped']} (per shard, summed)"
                    if a.get("gba") else "")]
                for n, a in arms.items()] + [
                [f"{n}: steps per worker", ", ".join(str(w["steps"]) for w in a["per_worker"]),
                 "fast workers take more chunks from the queue" if a["mode"] != "sync" else
                 "lock-step"] for n, a in arms.items()],
            "Throughput as summary.json reports it (train_s from the first step)": [
                [f"{n}: samples / train_s", a["summary_samples_per_s"], ""]
                for n, a in arms.items()],
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(
                {n: {**a, "cpu_rounds": [a["cpu"]]} for n, a in arms.items()}),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }
