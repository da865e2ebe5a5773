"""`recsync bench SCENARIO`: every arm of a scenario measured side by side in one run.

Each scenario module has ``run(out: Path, scale: float) -> dict`` returning
``{"scenario", "arms": {name: summary}, "ratios": {name: float}, ...}``; this package writes
``results.json``, ``report.md`` and the plots. Scenarios import the same model, data and trainer
code as training: they never fork it.
"""

from __future__ import annotations

from pathlib import Path

from recsync.bench import (chaos, eager, local, modes, overhead, recovery, scaling, shadow,
                           stragglers, switching)
from recsync.bench.report import write_results

SCENARIOS = {"local": local.run, "overhead": overhead.run, "scaling": scaling.run,
             "stragglers": stragglers.run, "switching": switching.run, "shadow": shadow.run,
             "eager": eager.run, "recovery": recovery.run, "modes": modes.run,
             "chaos": chaos.run}


def run_scenario(name: str, out: Path, scale: float = 1.0) -> dict:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; valid: {sorted(SCENARIOS)}")
    if scale <= 0:
        raise ValueError(f"--scale must be > 0, got {scale}")
    out.mkdir(parents=True, exist_ok=True)
    results = SCENARIOS[name](out, scale)
    write_results(out, results)
    return results
