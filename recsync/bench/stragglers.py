"""Scenario `stragglers`: sync and gba on an EMULATED cluster of 4 workers, one of them 4x slower.

N = 4 workers x ``CORES_PER_WORKER`` cores and S = 2 PS shards x ``CORES_PER_SHARD`` cores
(``[emulation]``: each process paces itself as a machine of that size, so the straggler slows
only itself, as on separate machines), one pass over the same synthetic data
(emulated.BENCH_SPEC) in every arm, the same model and hyper-parameters in every arm: those of
mode sync (row-wise Adagrad on rows, Adagrad on dense parameters, the project's defaults, tuned
for a batch of 4096 samples = 4 workers x 1024), never retuned for gba.

Arms, each run once per seed (``--seeds``, ``train.seed`` = 0, 1, ...; arms interleaved):
- ``sync``, ``gba``: worker 0 is an EMULATED straggler, its pacing FACTOR x slower;
- ``sync_nostraggler``, ``gba_nostraggler``: no straggler;
and with seed 0 only (references): ``async`` with the straggler, and ``gba_threshold_1`` (gba
with the straggler and staleness threshold 1 instead of the default 4, so that the straggler's
gradients are decayed: the evidence for the default).

Ratios: ``gba_vs_sync_speed`` (training samples/s after a warm-up, from the metrics logs, as in
scenario `overhead`, median of the seeds) beside ``ideal_speed_ratio`` (the sum of the workers'
speeds over N x the slowest: 3.25, GBA's ceiling if every worker kept its own pace) and their
quotient ``gba_speed_vs_ideal``; ``sync_vs_sync_nostraggler_speed`` beside its ideal 1 /
FACTOR (what separate machines give); ``gba_minus_sync_auc`` and
``gba_minus_sync_auc_nostraggler``: the mean over seeds of the paired eval AUC differences
(their 95% t-intervals in ``differences``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench import overhead as ov
from recsync.bench import seeds as sd
from recsync.config import RunConfig, load_config
from recsync.metrics.plot import plot_runs

WORKERS, SHARDS, BATCH = 4, 2, 1024
# A shard's CPU per global step is about a worker's per step (measured: 72 ms against 65 ms
# at batch 1024), and gba with the straggler makes 3.25x sync's global steps: with r = 1.75 q
# the shards stay about half busy there instead of saturating (at q = r = 0.25, 0.9 busy).
CORES_PER_WORKER, CORES_PER_SHARD = 0.2, 0.35
FACTOR = 4.0
CHUNK_BATCHES = 4  # small chunks: the run ends with the straggler's last chunk, 4x slow
ROWS = 250_000  # training rows at --scale 1 (about 3 min per seed on a quiet 2-core machine)
EVAL_ROWS = 100_000
COMMON = [  # every arm adds its mode
    f"cluster.workers={WORKERS}", f"cluster.ps_shards={SHARDS}",
    f"train.batch_size={BATCH}", "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]",
    f"data.chunk_rows={CHUNK_BATCHES * BATCH}",
    "train.threads=1", "output.progress=false", "output.plot=false", "output.log_every_steps=1",
    "train.eval_every_samples=1000000000000",  # only the final evaluation: throughput arms
    # no dense warm-up (the default 100 updates would span all ~60 of sync's updates here, and
    # the data set and sizes were chosen without it): docs/sync_modes.md has its own figures
    "train.dense_warmup_steps=0",
    *em.emulation_args(CORES_PER_WORKER, CORES_PER_SHARD),
]
STRAGGLER = f"faults.stragglers=[{{ worker = 0, factor = {FACTOR} }}]"
ARMS = {
    "sync": ['mode="sync"', STRAGGLER],
    "gba": ['mode="gba"', STRAGGLER],
    "sync_nostraggler": ['mode="sync"'],
    "gba_nostraggler": ['mode="gba"'],
    "async": ['mode="async"', STRAGGLER],
    # evidence for the default threshold (4): decaying the straggler's gradients instead
    "gba_threshold_1": ['mode="gba"', STRAGGLER, "gba.staleness_threshold=1"],
}
ONCE = ("async", "gba_threshold_1")  # seed 0 only
ideal_speed_ratio = em.ideal_speed_ratio  # scenario `switching` and the tests use it from here


def make_data(path: Path, rows: int) -> Path:
    return em.make_data(path, rows, EVAL_ROWS)


def arm_config(data: Path, extra: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *extra])


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    data = make_data(out / "data", max(100_000, round(ROWS * scale)))
    cfgs = {name: arm_config(data, extra) for name, extra in ARMS.items()}
    runs = sd.seeded_runs(list(cfgs), cfgs.__getitem__, out, seeds, once=ONCE)
    arms = {name: sd.seeded_entry(r) for name, r in runs.items()}
    plot_runs([out / "arms" / n / "seed0" for n in arms], out / "quality.png", labels=list(arms))

    def speed(name):
        return arms[name]["samples_per_s"]

    diffs = {"gba_minus_sync_auc": sd.auc_difference(arms, "gba", "sync"),
             "gba_minus_sync_auc_nostraggler": sd.auc_difference(arms, "gba_nostraggler",
                                                                 "sync_nostraggler"),
             "async_minus_sync_auc": sd.auc_difference(arms, "async", "sync"),
             "gba_threshold_1_minus_gba_auc": sd.auc_difference(arms, "gba_threshold_1", "gba")}
    ideals = {"gba_vs_sync_speed": (speed("gba") / speed("sync"),
                                    em.ideal_speed_ratio([FACTOR] + [1.0] * (WORKERS - 1))),
              "sync_vs_sync_nostraggler_speed": (speed("sync") / speed("sync_nostraggler"),
                                                 1.0 / FACTOR),
              "gba_vs_gba_nostraggler_speed": (
                  speed("gba") / speed("gba_nostraggler"),
                  em.ideal_speed_ratio([FACTOR] + [1.0] * (WORKERS - 1)) / FACTOR)}
    ratios = {name: measured for name, (measured, _) in ideals.items()}
    ratios["ideal_speed_ratio"] = ideals["gba_vs_sync_speed"][1]
    ratios["gba_speed_vs_ideal"] = ratios["gba_vs_sync_speed"] / ratios["ideal_speed_ratio"]
    ratios.update({name: d["mean"] for name, d in diffs.items()})
    worst = em.worst_worker_deviation(arms)
    if worst is not None:
        ratios["emulation_worst_worker_deviation"] = worst
    wall_s = time.perf_counter() - started
    return {
        "scenario": "stragglers",
        "emulation_label": em.label(arms),
        "description": (
            f"{WORKERS} workers x batch {BATCH}, {SHARDS} PS shards, one pass "
            f"over {arms['sync']['samples']:,} synthetic rows ({em.spec_text()}) in every arm; "
            f"DLRM with MLPs [64, 32] and [64, 32], the default optimizers and learning rates "
            f"(those of sync) in every arm; chunks of {CHUNK_BATCHES} batches. The straggler is "
            f"EMULATED: worker 0 paces its steps {FACTOR:g}x slower. {seeds} seeds per arm "
            f"(async and gba_threshold_1: seed 0 only), arms interleaved within each seed. "
            f"samples/s counts the steps after a warm-up of {ov.WARMUP_STEPS} steps per worker "
            f"(from the metrics logs), median of seeds; AUC on the whole eval split "
            f"({EVAL_ROWS:,} rows), mean of seeds; differences paired by seed. Scenario wall "
            f"time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "ideals": {k: {"measured": m, "ideal": i, "of_ideal": m / i}
                   for k, (m, i) in ideals.items()},
        "differences": diffs,
        "seeds": seeds,
        "stragglers_emulated": True,
        "wall_s": wall_s,
        "tables": {
            "AUC differences, paired by seed (mean, 95% t-interval)": [
                sd.difference_row(n, d) for n, d in diffs.items()],
            "Quality per arm": sd.auc_rows(arms) + [
                [f"{n}: staleness mean (max)", a["staleness"]["mean"],
                 f"max {a['staleness']['max']}"
                 + (f"; gba gradients applied {a['gba']['applied']}, decayed "
                    f"{a['gba']['decayed']}, dropped {a['gba']['dropped']} (per shard, summed; "
                    f"last seed)" if a.get("gba") else "")]
                for n, a in arms.items() if a["staleness"]["mean"] is not None],
            "Steps per worker (last seed)": [
                [n, ", ".join(str(w["steps"]) for w in a["per_worker"]),
                 "fast workers take more chunks from the queue" if a["mode"] != "sync" else
                 "lock-step"] for n, a in arms.items()],
            "Throughput as summary.json reports it (train_s from the first step)":
                ov.summary_rows(arms, {}),
            "EMULATED cluster: wall time over CPU time of each process": em.emulation_rows(arms),
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }
