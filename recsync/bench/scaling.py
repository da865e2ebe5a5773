"""Scenario `scaling`: throughput with 1 and 2 workers, in modes async and sync, on 2 PS shards.

Arms (all on an embedded Ray instance with 2 PS shards; the model, batch, optimizers and data of
scenario `overhead`: DLRM with the default MLPs, 26 tables x 1e6 rows x 16, batch 4096 per
worker, one intra-op thread per worker):

- ``async_1w``, ``async_2w``: mode async with 1 and 2 workers.
- ``sync_1w``, ``sync_2w``: mode sync with 1 and 2 workers (a global step is one batch per
  worker).

Every worker does the same number of steps, so 2 workers train twice the samples; the data holds
enough rows for that (workers take chunks of 16 batches from a shared queue). samples/s is
measured as in `overhead` (from the metrics log, after a warm-up of a few steps per worker, so
start-up is not counted), over alternating rounds; the ratios are ratios of medians.

Why the default model rather than a smaller one: what two workers can do in parallel is their
forward and backward passes; the PS shards (row lookups and updates, serialization), the driver
and Ray's own processes need CPU too, and on a 2-core machine they take it from the workers. A
smaller MLP would shrink the parallel part and leave the rest as it is, so it would scale worse,
not better. The report shows, for each arm, how many cores the workers, the PS shards, the
driver, Ray's own processes and everything outside the job used while throughput was measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from recsync.bench import overhead as ov

ROUNDS = 2
STEPS = 100  # per worker and arm, x --scale
SHARDS = 2
CHUNK_BATCHES = 16
ARMS = {f"{mode}_{w}w": [f"mode=\"{mode}\"", f"cluster.workers={w}", f"cluster.ps_shards={SHARDS}"]
        for mode in ("async", "sync") for w in (1, 2)}


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    steps = max(2 * ov.WARMUP_STEPS, round(STEPS * scale))
    # 2 workers x steps, plus a chunk per worker that a worker may stop in the middle of
    data = ov.make_data(out / "data", 2 * (steps + CHUNK_BATCHES) * ov.BATCH, ov.TABLE_ROWS)
    cfgs = {name: ov.arm_config(data, steps, extra) for name, extra in ARMS.items()}
    runs = ov.alternate(cfgs, out, ROUNDS)
    arms = {name: ov.arm_entry(r) for name, r in runs.items()}
    ratios = {f"{m}_2w_vs_1w_speed": arms[f"{m}_2w"]["samples_per_s"]
              / arms[f"{m}_1w"]["samples_per_s"] for m in ("async", "sync")}
    summary_ratios = {k: arms[f"{m}_2w"]["summary_samples_per_s"]
                      / arms[f"{m}_1w"]["summary_samples_per_s"]
                      for k, m in (("async_2w_vs_1w_speed", "async"),
                                   ("sync_2w_vs_1w_speed", "sync"))}
    per_round = {m: [x / y for x, y in zip(arms[f"{m}_2w"]["rounds_samples_per_s"],
                                           arms[f"{m}_1w"]["rounds_samples_per_s"])]
                 for m in ("async", "sync")}
    step_s = {n: a["worker_step_s_median"] for n, a in arms.items()}
    wall_s = time.perf_counter() - started
    return {
        "scenario": "scaling",
        "description": (
            f"{ROUNDS} alternating rounds of {steps} steps x {ov.BATCH} samples per worker and "
            f"arm; {SHARDS} PS shards; 26 tables x {ov.TABLE_ROWS:,} rows x 16, default DLRM "
            f"MLPs, 1 intra-op thread per worker; {_cores()} cores for everything (workers, PS "
            f"shards, driver, Ray). samples/s counts the steps after a warm-up of "
            f"{ov.WARMUP_STEPS} steps per worker. Per-round 2w/1w ratios: "
            + "; ".join(f"{m} {', '.join(f'{x:.3f}' for x in v)}" for m, v in per_round.items())
            + ". Median step time of a worker (s, metrics logs after the warm-up, median of "
              "rounds): "
            + ", ".join(f"{n} {v:.3f}" for n, v in step_s.items() if v)
            + f". Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "ratios_from_summary_json": summary_ratios,
        "worker_step_s": step_s,
        "wall_s": wall_s,
        "tables": {
            "Throughput as summary.json reports it (train_s from the first step)":
                ov.summary_rows(arms, summary_ratios),
            "Start-up and measurement window (medians of rounds)": ov.timeline_rows(arms),
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(arms),
            "Memory: peak RSS of the whole job, all processes summed": ov.memory_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def _cores() -> int:
    return os.cpu_count() or 0
