"""Repeated seeds per arm: the runs (arms interleaved within each seed) and their statistics.

A quality difference of 0.001 AUC between two modes is smaller than the spread of single runs
(data order and initialisation), so the seeded scenarios run every arm once per ``train.seed``
and compare arms by the paired difference per seed (the same seed gives both arms the same
initial model and data order): its mean and the 95% t-interval of that mean.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Callable

from scipy import stats as sps

from recsync.api import override
from recsync.bench import overhead as ov
from recsync.config import RunConfig

DEFAULT_SEEDS = 3


def seeded_runs(names: list[str], config: Callable[[str], RunConfig], out: Path, seeds: int,
                once: tuple[str, ...] = (),
                results: dict[str, list[dict]] | None = None,
                run_arm: Callable[[RunConfig, Path, str], dict] | None = None
                ) -> dict[str, list[dict]]:
    """Every arm once per seed 0 .. seeds-1 (``train.seed``), the arms interleaved within each
    seed, so that a drift of the machine over the scenario hits every arm alike; the arms in
    ``once`` (reference or speed-only arms) with seed 0 only. ``config(name)`` is called just
    before each run, so it may depend on the runs before (filled into ``results`` as they end,
    when given). Outputs in ``out/arms/<arm>/seed<s>``. ``run_arm``: what runs one (default
    ``overhead.run_arm``, a run on Ray; scenario `simulated`'s simulations)."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    runs = {} if results is None else results
    runs.update({name: [] for name in names})
    for s in range(seeds):
        for name in names:
            if s > 0 and name in once:
                continue
            print(f"seed {s + 1}/{seeds}: {name} ...", flush=True)
            cfg = override(config(name), **{"train.seed": s})
            runs[name].append((run_arm or ov.run_arm)(cfg, out / "arms" / name / f"seed{s}",
                                                      name))
            print(f"  eval AUC {runs[name][-1]['eval']['auc']:.4f}", flush=True)
    return runs


def describe(values: list[float]) -> dict:
    """Mean, sample standard deviation (None for one value), min and max."""
    return {"n": len(values), "mean": statistics.mean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "values": list(values)}


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` Student-t confidence interval of the mean (None below two values)."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.mean(values), statistics.stdev(values)
    half = sps.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return (mean - half, mean + half)


def paired_difference(a: list[float], b: list[float]) -> dict:
    """a - b seed by seed: ``describe`` of the differences plus ``ci95``, their mean's 95%
    t-interval (None with one seed)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired values need the same number of seeds, got {len(a)} and "
                         f"{len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    return {**describe(diffs), "ci95": t_interval(diffs)}


def seeded_entry(results: list[dict]) -> dict:
    """An arm over its seeds: the last seed's summary, with samples/s and train_s the medians
    of the seeds and the eval AUC the mean (each seed's in ``auc_seeds``, the statistics in
    ``auc_stats``)."""
    entry = ov.arm_entry(results)
    aucs = [r["eval"]["auc"] for r in results]
    return {**entry, "eval": {**entry["eval"], "auc": statistics.mean(aucs)},
            "auc_seeds": aucs, "auc_stats": describe(aucs),
            "emulation_seeds": [r.get("emulation") for r in results]}


def auc_difference(arms: dict, a: str, b: str) -> dict:
    """The paired difference of the eval AUCs of arms ``a`` and ``b`` (``seeded_entry``) over
    the seeds both ran (an arm run with seed 0 only pairs with the other's seed 0)."""
    n = min(len(arms[a]["auc_seeds"]), len(arms[b]["auc_seeds"]))
    return paired_difference(arms[a]["auc_seeds"][:n], arms[b]["auc_seeds"][:n])


def difference_row(name: str, diff: dict) -> list:
    """A report row: the mean difference, its interval, spread and each seed's."""
    ci = diff["ci95"]
    note = (f"95% t-interval [{ci[0]:+.4f}, {ci[1]:+.4f}], " if ci else "one seed: no interval, ")
    note += (f"sd {diff['sd']:.4f}, " if diff["sd"] is not None else "")
    note += "per seed " + ", ".join(f"{v:+.4f}" for v in diff["values"])
    return [name, diff["mean"], note]


def auc_rows(arms: dict) -> list[list]:
    """One row per arm: mean eval AUC over seeds, spread, Bayes-optimal AUC."""
    rows = []
    for name, a in arms.items():
        st, bayes = a["auc_stats"], a["eval"]["bayes_auc"]
        seeds = f"{st['n']} seed" + ("s" if st["n"] > 1 else "")
        rows.append([f"{name}: eval AUC, mean of {seeds}", st["mean"],
                     (f"sd {st['sd']:.4f}, " if st["sd"] is not None else "")
                     + f"range {st['min']:.4f} - {st['max']:.4f}"
                     + (f"; Bayes-optimal {bayes:.4f} (gap {bayes - st['mean']:.4f})"
                        if bayes is not None else "")])
    return rows
