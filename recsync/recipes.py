"""Named full runs as short functions. ``quickstart`` is the README's main job."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from recsync.config import ClusterConfig, RunConfig, load_config
from recsync.config_sections import EmulationConfig
from recsync.data.synthetic import SynthSpec, generate

QUICKSTART_ROWS = 2_000_000  # the straggler's third outlasts the controller's 5 s window
QUICKSTART_OVERRIDES = [  # 4 workers x batch 1024 = the global batch the defaults are tuned for
    'mode="sync"', "cluster.workers=4", "cluster.ps_shards=2", "train.batch_size=1024",
    "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]", "train.threads=1",
    "data.chunk_rows=4096",
]
STRAGGLER_FACTOR = 4.0
RESERVE_CORES = EmulationConfig().reserve_cores  # for Ray, the driver and the work queue


def emulated_cluster(workers: int, shards: int, cores: int | None = None) -> list[str]:
    """Overrides that run ``workers`` and ``shards`` as an EMULATED cluster of equal machines
    on this one: the cores it has (less RESERVE_CORES) shared evenly, at most one each, so
    that a straggler slows only itself, as on separate machines (docs/design.md §6b)."""
    cores = os.cpu_count() if cores is None else cores
    each = min(1.0, (cores - RESERVE_CORES) / (workers + shards))
    each = int(each * 100) / 100  # two decimals, rounded down: the total stays within
    if each <= 0:
        raise ValueError(f"an emulated cluster of {workers} workers and {shards} shards needs "
                         f"more than {cores} cores")
    return [f"emulation.cores_per_worker={each}", f"emulation.cores_per_shard={each}",
            f"emulation.reserve_cores={RESERVE_CORES}"]


CALIBRATION_STEPS = 60


def ensure_synthetic(out: Path, rows: int, spec: SynthSpec = SynthSpec()) -> Path:
    """Generate a synthetic data set into ``out`` unless the same one is already there."""
    meta = out / "meta.json"
    if meta.is_file():
        m = json.loads(meta.read_text())
        if (m.get("source", {}).get("spec") == asdict(spec)
                and m["splits"]["train"]["rows"] == rows):
            print(f"reusing synthetic data in {out}")
            return out
    r = generate(out, rows=rows, spec=spec, overwrite=True)
    print(f"generated {r.train_rows:,} + {r.eval_rows:,} rows in {r.seconds:.1f} s "
          f"({r.rows_per_s:,.0f} rows/s); Bayes-optimal eval AUC {r.bayes_auc:.4f}")
    return out


def straggler_in_the_middle(cfg: RunConfig, out: Path) -> tuple[float, float, float]:
    """(start_s, end_s, samples/s): a short calibration run of ``cfg`` without stragglers
    measures this machine's speed, which gives the time T one pass takes; an emulated straggler
    then comes at T/3 and goes at 2T/3."""
    from recsync.metrics.core import read_jsonl
    from recsync.run.driver import run
    calib = cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"max_steps": CALIBRATION_STEPS}), "output": cfg.output.model_copy(
        update={"plot": False, "progress": False, "log_every_steps": 1})})
    run(calib, out, overwrite=True)
    records = [r for r in read_jsonl(out / "metrics.jsonl") if r["samples"] > 0]
    first, last = records[len(records) // 4], records[-1]  # past the workers' warm-up
    rate = (last["samples"] - first["samples"]) / (last["time_s"] - first["time_s"])
    horizon_s = cfg.train.epochs * _train_rows(cfg) / rate
    return horizon_s / 3, 2 * horizon_s / 3, rate


def _train_rows(cfg: RunConfig) -> int:
    return json.loads((Path(cfg.data.path) / "meta.json").read_text())["splits"]["train"]["rows"]


def quickstart(out: Path) -> dict:
    """Synthetic data with a known Bayes AUC; then an EMULATED cluster of 4 workers and 2 PS
    shards (each paced as a machine of its own), one worker 4x slower for the middle third of
    the run, trained in sync only and with the mode controller switching to gba and back (both
    on the embedded Ray instance)."""
    from recsync.cluster.ray_session import ray_session
    from recsync.run.driver import run
    data = ensure_synthetic(out / "data", QUICKSTART_ROWS)
    emulation = emulated_cluster(4, 2)
    base = load_config(None, [f"data.path={json.dumps(str(data))}", *QUICKSTART_OVERRIDES,
                              *emulation])
    with ray_session(ClusterConfig()):  # one Ray instance for the three runs
        print("measuring this machine's speed (sync, 60 steps) ...", flush=True)
        start_s, end_s, rate = straggler_in_the_middle(base, out / "calibration")
        straggler = (f"faults.stragglers=[{{ worker = 0, factor = {STRAGGLER_FACTOR}, "
                     f"start_s = {start_s:.1f}, end_s = {end_s:.1f} }}]")
        print(f"{rate:,.0f} samples/s: worker 0 will be {STRAGGLER_FACTOR:g}x slower (EMULATED) "
              f"from {start_s:.0f} s to {end_s:.0f} s of each run", flush=True)
        results = {}
        for name, extra in (("sync_only", []), ("auto", ["switching.auto=true"])):
            print(f"run {name} ...", flush=True)
            cfg = load_config(None, [f"data.path={json.dumps(str(data))}",
                                     *QUICKSTART_OVERRIDES, *emulation, straggler, *extra])
            results[name] = run(cfg, out / name, overwrite=True)
    return results
