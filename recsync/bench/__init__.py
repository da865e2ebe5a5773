"""`recsync bench SCENARIO`: every arm of a scenario measured side by side in one run.

Each scenario module has ``run(out: Path, scale: float) -> dict`` (the SEEDED ones also take
``seeds``) returning
``{"scenario", "arms": {name: summary}, "ratios": {name: float}, ...}``; this package writes
``results.json``, ``report.md`` and the plots. Scenarios import the same model, data and trainer
code as training: they never fork it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

# name -> what it answers (`recsync bench --help` lists them; README "Benchmarks" has the arms).
# Each is the module recsync.bench.<name>, imported only when it runs.
SCENARIOS = {
    "local": "recsync's local run against a plain PyTorch loop; the data pipeline",
    "overhead": "what the distributed runtime costs against one process; memory",
    "scaling": "throughput from 1 to 2 workers",
    "stragglers": "gba against sync with an emulated straggler",
    "switching": "the mode controller switching sync -> gba -> sync",
    "shadow": "background synchronization (ShadowSync) against foreground and none",
    "eager": "eager pull and the staleness-aware learning rate",
    "recovery": "PS-shard failures: full and partial recovery, CPR's checkpoints",
    "modes": "every mode side by side on one data set",
    "chaos": "every mode under random kills of workers and shards (emulated)",
    "quality": "every built-in model (defaults; defaults + early stopping) against logistic "
               "regression and LightGBM on every shared real sample",
    "sizing": "memory per PS shard per million rows of each dim, per worker",
    "ps": "one PS shard's pull and push rows/s (Ray, in process, raw torch); its saturation "
          "curve with 1-12 async workers (EMULATED)",
    "peers": "recsync local and async (1 worker, 1 shard) against TorchRec on the same DLRM",
    "dense": "the dense step: float32, bfloat16 autocast, torch.compile; threads or processes",
    "dynamic": "dynamic embedding tables against fixed ones: AUC at the same memory, a "
               "drifting stream, bytes per row, pull and push rows/s, collisions",
    "elastic": "an elastic run going 4 -> 2 -> 4 workers against fixed runs (EMULATED); a "
               "shard moved off a drained node of a 2-node loopback cluster; sync 4 -> 2 "
               "-> 4 against a fixed 4 (eval AUC, 3 seeds)",
    "simulated": "the SIMULATED cluster against the EMULATED runtime at 2 and 4 workers; sync, "
                 "gba and async at 32-512 simulated workers with stragglers; shadow at 1-64 "
                 "trainers",
    "simulated_shadow": "scenario simulated's shadow part alone: SIMULATED shadow throughput "
                        "at 1-64 trainers, S-* against FR-* at 64",
    "simulated_validation": "scenario simulated's validation alone: the SIMULATED cluster "
                            "against the EMULATED runtime at 2 and 4 workers",
}


# Scenarios whose arms run once per seed (``--seeds``; recsync/bench/seeds.py).
SEEDED = ("stragglers", "switching", "shadow", "eager", "peers", "dense", "dynamic",
          "simulated", "simulated_shadow", "simulated_validation")


def run_scenario(name: str, out: Path, scale: float = 1.0, seeds: int | None = None) -> dict:
    """Run scenario ``name``; ``seeds``: runs per arm of a SEEDED scenario (None: its default)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    if scale <= 0:
        raise ValueError(f"--scale must be > 0, got {scale}")
    if seeds is not None and name not in SEEDED:
        raise ValueError(f"--seeds applies to the scenarios {', '.join(SEEDED)}, not {name!r}")
    if seeds is not None and seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    out.mkdir(parents=True, exist_ok=True)
    from recsync.bench.report import write_results
    module = importlib.import_module(f"recsync.bench.{name}")
    results = (module.run(out, scale) if seeds is None else module.run(out, scale, seeds))
    write_results(out, results)
    return results
