"""Scenario `simulated_shadow` (and the shadow part of scenario `simulated`): ShadowSync at the
scale of its paper, SIMULATED (`recsync simulate`, docs/simulate.md): trainers of one training
thread each against a fixed number of PS shards.

- Throughput: mode shadow with its defaults (model averaging in background rounds at least
  ``shadow.min_interval_s`` apart) at ``TRAINERS`` trainers, ``STEPS`` steps each; samples/s
  over the whole run (simulated seconds); efficiency(N) = samples/s(N) / (N x samples/s(1)),
  ratio ``shadow_64_vs_1_efficiency``. Once with the model of time measured for the shards
  (`bench ps`, for the config's `cluster.transport`: a fixed cost per call, which every shard
  pays for every trainer's step however many shards there are), and once with shards that
  cost nothing (``free_shards``): what the rounds alone leave of linear scaling. The shards'
  busy fraction of each arm says which limits it.
- Quality: S-MA, S-EASGD, S-BMUF (mode shadow) against FR-MA, FR-EASGD, FR-BMUF (mode
  foreground, a round every ``shadow.foreground_every`` steps) at ``QUALITY_TRAINERS`` trainers,
  one pass over the same data, every seed: S-* - FR-* eval AUC paired by seed, with 95%
  intervals.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

from recsync.api import override
from recsync.bench import emulated as em
from recsync.bench import seeds as sd
from recsync.bench import simulated as sim
from recsync.config import RunConfig
from recsync.simulation.timing import Timing

TRAINERS = (1, 4, 16, 64)
STEPS = 200  # per trainer, in the throughput arms
THROUGHPUT_BATCH = 512
QUALITY_TRAINERS = 64
# one pass at --scale 1: about 98 steps per trainer, 3 minutes of real time per run here
# (2026-11-27: docs/benchmarks/2026-11-27-simulated-shadow.md)
QUALITY_ROWS = 200_000
ALGORITHMS = ("ma", "easgd", "bmuf")
FREE_SHARDS = {"pull_s_per_row": 0.0, "push_s_per_row": 0.0, "pull_call_s": 0.0,
               "push_call_s": 0.0}


def shadow_config(data: Path, mode: str, trainers: int, batch: int, algorithm: str = "ma",
                  steps: int = 0, rows: int = 0) -> RunConfig:
    """``steps``: that many per trainer (over as many passes of the ``rows`` as they need),
    else one pass."""
    cfg = sim.base_config(data, mode, trainers, sim.SCALE_SHARDS, batch)
    keys = {"shadow.algorithm": algorithm}
    if steps:
        passes = math.ceil(trainers * steps * batch / rows) + 1
        keys.update({"train.max_steps": steps, "train.epochs": passes})
    return override(cfg, **keys)


def arms_at_scale(out: Path, scale: float, seeds: int) -> tuple[dict, dict]:
    """(seeded entries by arm, the figures the ratios and report read)."""
    data = em.make_data(out / "data", max(100_000, round(QUALITY_ROWS * scale)), sim.EVAL_ROWS)
    ds = sim.Dataset(data)  # (through the scenario module: its test fakes it)
    configs: dict[str, RunConfig] = {}
    timings: dict[str, Timing] = {}
    costs = {}
    for batch in (THROUGHPUT_BATCH, sim.SCALE_BATCH):
        cfg = shadow_config(data, "shadow", 1, batch)
        costs[batch] = Timing(compute_s=sim.measure_compute_s(cfg, ds),
                              **sim.worker_sides(cfg, ds))
        print(f"measured here at batch {batch}: compute {costs[batch].compute_s * 1e3:.2f} ms "
              f"per step; the trainer's own CPU before / after it "
              f"{costs[batch].pull_side_s * 1e3:.2f} / {costs[batch].push_side_s * 1e3:.2f} "
              f"ms", flush=True)
    for n in TRAINERS:
        for kind, timing in (("", costs[THROUGHPUT_BATCH]),
                             ("_free_shards", replace(costs[THROUGHPUT_BATCH], **FREE_SHARDS))):
            name = f"shadow_{n}{kind}"
            configs[name] = shadow_config(data, "shadow", n, THROUGHPUT_BATCH, steps=STEPS,
                                          rows=ds.rows("train"))
            timings[name] = timing
    for algorithm in ALGORITHMS:
        for mode, tag in (("shadow", "S"), ("foreground", "FR")):
            name = f"{tag}-{algorithm}_{QUALITY_TRAINERS}"
            configs[name] = shadow_config(data, mode, QUALITY_TRAINERS, sim.SCALE_BATCH,
                                          algorithm)
            timings[name] = costs[sim.SCALE_BATCH]
    once = tuple(name for name in configs if name.startswith("shadow_"))
    runs = sim.parallel_seeded_runs(configs, timings, out, seeds, once=once)
    arms = {name: sd.seeded_entry(r) for name, r in runs.items()}
    figures = {"efficiency": {}, "shard_busy_frac_max": {}, "differences": {}}
    for kind in ("", "_free_shards"):
        one = arms[f"shadow_1{kind}"]["samples_per_s"]
        for n in TRAINERS:
            a = arms[f"shadow_{n}{kind}"]
            figures["efficiency"][f"{n}{kind}"] = a["samples_per_s"] / (n * one)
            figures["shard_busy_frac_max"][f"{n}{kind}"] = max(
                f or 0.0 for f in a["simulated"]["shard_busy_frac"])
    for algorithm in ALGORITHMS:
        figures["differences"][f"S-{algorithm}_minus_FR-{algorithm}_auc"] = sd.auc_difference(
            arms, f"S-{algorithm}_{QUALITY_TRAINERS}", f"FR-{algorithm}_{QUALITY_TRAINERS}")
    figures["costs"] = {b: t.as_dict() for b, t in costs.items()}
    return arms, figures


def ratios(figures: dict) -> dict:
    top = max(TRAINERS)
    out = {f"shadow_{top}_vs_1_efficiency": figures["efficiency"][str(top)],
           f"shadow_{top}_vs_1_efficiency_free_shards":
               figures["efficiency"][f"{top}_free_shards"]}
    for name, diff in figures["differences"].items():
        out[name] = diff["mean"]
    return out


def tables(arms: dict, figures: dict) -> dict:
    def row(n: int, kind: str) -> list:
        a = arms[f"shadow_{n}{kind}"]
        return [f"{n} trainers", figures["efficiency"][f"{n}{kind}"],
                f"{a['samples_per_s']:,.0f} simulated samples/s; busiest shard "
                f"{figures['shard_busy_frac_max'][f'{n}{kind}']:.0%} busy; rounds per trainer "
                f"{min(a['shadow']['syncs'])}-{max(a['shadow']['syncs'])}; real wall "
                f"{a['simulated']['real_wall_s']:.0f} s"]

    return {
        "Shadow (MA) throughput efficiency against 1 trainer, shards as measured (SIMULATED)":
            [row(n, "") for n in TRAINERS],
        "The same with shards that cost nothing (SIMULATED)":
            [row(n, "_free_shards") for n in TRAINERS],
        f"S-* minus FR-* eval AUC at {QUALITY_TRAINERS} trainers, paired by seed (mean, 95% "
        f"t-interval)": [sd.difference_row(name, d)
                         for name, d in figures["differences"].items()],
    }


def description(seeds: int) -> str:
    return (f"SIMULATED ShadowSync: mode shadow (MA, defaults) at {', '.join(map(str, TRAINERS))} "
            f"trainers x batch {THROUGHPUT_BATCH}, {STEPS} steps each, {sim.SCALE_SHARDS} "
            f"shards, with the shards' measured costs and with free shards (seed 0); S-* "
            f"against FR-* (MA, EASGD, BMUF) at {QUALITY_TRAINERS} trainers x batch "
            f"{sim.SCALE_BATCH}, one pass, {seeds} seeds; the compute and the trainer's own "
            f"CPU per step measured here; synthetic data ({em.spec_text()}).")


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    arms, figures = arms_at_scale(out, scale, seeds)
    wall_s = time.perf_counter() - started
    return {
        "scenario": "simulated_shadow",
        "emulation_label": "Every arm is SIMULATED (recsync simulate): its seconds are "
                           "simulated seconds.",
        "description": description(seeds) + f" Scenario wall time {wall_s / 60:.1f} min.",
        "arms": arms, "ratios": ratios(figures), "figures": figures,
        "differences": figures["differences"], "seeds": seeds, "wall_s": wall_s,
        "tables": {**tables(arms, figures), "Quality per arm": sd.auc_rows(arms)},
    }
