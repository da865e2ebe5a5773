"""Scenario `recovery` at the CPR paper's operating point: failures rare enough, against what a
save, a restart and the work lost cost, that full recovery's overhead is about 8% of the run
(the paper's emulation of production: MTBF 14-30 h, full recovery 8.2-8.5%).

Over a run of length T with K failures (MTBF M = T / K) and full recovery checkpointing at
Young's interval I = sqrt(2 O M) (O: what a save blocks training), each failure costs the
downtime D (kill to training again), the work done again beyond the interval R (chunks leased
when the checkpoint was taken are trained again from their start) and on average I / 2 of
work done again, and the saves cost O per interval: expected overhead
(K (D + R + I / 2) + (T / I) O) / T. Given the measured O, D and R, ``run_length_for`` finds
the T at which that is the target: the run is made that long, and its failures are drawn
with mean T / K. Plain functions, tested against hand computations.
"""

from __future__ import annotations

import random

from recsync.checkpoint.interval import young_interval


def full_overhead_at(run_s: float, failures: int, save_s: float, downtime_s: float,
                     redo_s: float = 0.0) -> float:
    """Expected overhead fraction of full recovery over a run of ``run_s`` with ``failures``."""
    mtbf = run_s / failures
    interval = max(young_interval(save_s, mtbf), 1e-3)
    return (failures * (downtime_s + redo_s + interval / 2) + run_s / interval * save_s) / run_s


def run_length_for(target: float, failures: int, save_s: float, downtime_s: float,
                   redo_s: float = 0.0) -> float:
    """The run length T at which full recovery's expected overhead is ``target`` (it falls as T
    grows; bisection). Raises if the saves alone cost more than the target at any length."""
    if not 0 < target < 1 or failures < 1 or min(save_s, downtime_s, redo_s) < 0:
        raise ValueError(f"need 0 < target < 1, failures >= 1, costs >= 0; got {target}, "
                         f"{failures}, {save_s}, {downtime_s}, {redo_s}")
    lo, hi = 1e-3, 1e7
    if full_overhead_at(hi, failures, save_s, downtime_s, redo_s) > target:
        raise ValueError(f"full recovery costs more than {target:.1%} at any run length "
                         f"(save {save_s:.3f} s, downtime {downtime_s:.2f} s per failure)")
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        if full_overhead_at(mid, failures, save_s, downtime_s, redo_s) > target:
            lo = mid
        else:
            hi = mid
    return hi


def failure_schedule(train_s: float, start_s: float, failures: int, shards: int,
                     first_s: float, window: float, min_gap_s: float,
                     seeds: int = 10_000) -> tuple[int, float, list[dict]]:
    """(seed, mean, kills): the first seed whose exponential inter-arrival times with mean
    ``train_s / failures`` put exactly ``failures`` kills, each on a random shard, between
    ``first_s`` and ``start_s + window x train_s``, at least ``min_gap_s`` apart."""
    mean = train_s / failures
    end = start_s + window * train_s
    for seed in range(seeds):
        rng = random.Random(seed)
        at, kills = rng.expovariate(1 / mean), []
        while at < end:
            kills.append({"target": "ps", "index": rng.randrange(shards), "at_s": round(at, 1)})
            at += rng.expovariate(1 / mean)
        times = [k["at_s"] for k in kills]
        if (len(kills) == failures and times[0] >= first_s
                and all(b - a >= min_gap_s for a, b in zip(times, times[1:]))):
            return seed, mean, kills
    raise RuntimeError(f"no seed below {seeds} gives {failures} kills {min_gap_s:g} s apart "
                       f"between {first_s:g} s and {end:.0f} s")
