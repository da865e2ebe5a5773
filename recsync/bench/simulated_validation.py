"""Scenario `simulated_validation`: scenario `simulated`'s validation alone (simulated.py
``validation``: sync, async and gba at 1, 2 and 4 workers on the EMULATED cluster, then the
simulator at 2 and 4 with the model of time fitted on the one-worker runs), so that its
acceptance figures can be measured at ``--scale 1`` without the scale arms' hours. The same
arms, ratios and tables as in `simulated`."""

from __future__ import annotations

import time
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench import seeds as sd
from recsync.bench import simulated as whole


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    arms, compared, calibration = whole.validation(out, scale, seeds)
    wall_s = time.perf_counter() - started
    return {
        "scenario": "simulated_validation",
        "emulation_label": (f"Arms real_*: {em.label(arms)} Arms sim_* are SIMULATED "
                            f"(recsync simulate): their seconds are simulated seconds."),
        "description": (
            f"Scenario simulated's validation alone: modes "
            f"{', '.join(whole.VALIDATION_MODES)}, real on the EMULATED cluster "
            f"({whole.CORES_PER_WORKER} cores per worker, {whole.CORES_PER_SHARD} per shard, "
            f"{whole.SHARDS} shards) at 1, "
            f"{' and '.join(map(str, whole.VALIDATION_WORKERS))} workers x batch "
            f"{whole.VALIDATION_BATCH}; SIMULATED at "
            f"{' and '.join(map(str, whole.VALIDATION_WORKERS))} with the real runs' compute "
            f"per step and the overhead and jitter of their one-worker runs; synthetic data "
            f"({em.spec_text()}); {seeds} seeds. Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": whole.validation_ratios(compared),
        "validation": compared,
        "calibration": calibration,
        "seeds": seeds,
        "wall_s": wall_s,
        "tables": {**whole.validation_tables(compared, calibration),
                   "Quality per arm": sd.auc_rows(arms)},
    }
