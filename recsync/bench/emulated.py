"""What the seeded scenarios share: the EMULATED cluster they run on, the synthetic data set they
train on, the ideal speed ratios they are held against, and the report rows that check the
emulation (each process's wall time over its CPU time against 1 / its cores).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from recsync.data.synthetic import SynthSpec

# A data set where sync gets within 0.01 of the Bayes-optimal AUC in one pass of the scenarios
# (measured: docs/benchmarks.md, "The seeded scenarios' data set"): the default teacher's
# pairwise interactions among eight tables, 26 tables of up to 100,000 ids and id effects
# spread over the Zipf tail leave a one-pass model 0.045-0.05 short of the ceiling; this one
# keeps the interactions of three small tables and concentrates the id effects on the head.
BENCH_SPEC = SynthSpec(max_table_rows=10_000, interacting_tables=(0, 4, 5))
TOLERANCE = 0.10  # how far wall / CPU may be from 1 / cores before the report flags it


def make_data(path: Path, rows: int, eval_rows: int) -> Path:
    """BENCH_SPEC's data set with ``rows`` training and ``eval_rows`` eval rows."""
    print(f"generating {rows:,} + {eval_rows:,} synthetic rows ({BENCH_SPEC}) ...", flush=True)
    from recsync.data.synthetic import generate
    generate(path, rows=rows, eval_rows=eval_rows, overwrite=True, progress=False,
             spec=BENCH_SPEC)
    return path


def emulation_args(cores_per_worker: float, cores_per_shard: float) -> list[str]:
    return [f"emulation.cores_per_worker={cores_per_worker}",
            f"emulation.cores_per_shard={cores_per_shard}"]


def ideal_speed_ratio(factors: list[float]) -> float:
    """Σ speeds / (N x slowest speed), a worker's speed being 1 / its slow-down factor: how much
    faster than sync a mode whose workers each keep their own pace can be (GBA's ceiling)."""
    speeds = [1.0 / f for f in factors]
    return sum(speeds) / (len(speeds) * min(speeds))


def ideal_windowed_speed_ratio(factors: list[float], window_s: tuple[float, float],
                               sync_s: float) -> float:
    """The ideal speed of a run that keeps every worker's pace while the straggler is present
    (``factors``, during ``window_s`` of training time) and runs as sync outside it, over
    sync's, given that sync took ``sync_s``: the ceiling of the mode controller switching
    sync -> gba -> sync with no cost.

    Sync runs at rate R outside the window and R / max(factors) in it, so its one pass of D
    samples gives D / R; the ideal run goes at R x mean(1 / factors) in the window."""
    slow = 1.0 / max(factors)
    fast = sum(1.0 / f for f in factors) / len(factors)
    start = min(max(window_s[0], 0.0), sync_s)
    end = min(max(window_s[1], start), sync_s)
    work = sync_s - (end - start) * (1.0 - slow)  # D / R, in seconds at rate R
    if work <= start:  # the ideal run would end before the straggler comes
        return sync_s / work
    if work <= start + (end - start) * fast:  # it ends inside the window
        return sync_s / (start + (work - start) / fast)
    return sync_s / (work + (end - start) * (1.0 - fast))


def _worker_rows(name: str, entries: list[dict]) -> list[list]:
    rows = []
    ranks = sorted({w["rank"] for e in entries for w in e["workers"]})
    for rank in ranks:
        per = [w for e in entries for w in e["workers"] if w["rank"] == rank]
        ratio = [w["wall_per_cpu"] for w in per]
        expected = per[0]["expected"]
        dev = max(abs(x / expected - 1.0) for x in ratio)
        rows.append([f"{name}: worker {rank} wall / CPU per step", statistics.median(ratio),
                     f"expected {expected:g}; per seed " + ", ".join(f"{x:.3g}" for x in ratio)
                     + f"; largest deviation {dev:.1%}"
                     + ("" if dev <= TOLERANCE else f" (more than {TOLERANCE:.0%})")])
    for shard in sorted({s["shard"] for e in entries for s in e["shards"]}):
        per = [s for e in entries for s in e["shards"] if s["shard"] == shard]
        ratio = [s["wall_per_cpu"] for s in per]
        rows.append([f"{name}: PS shard {shard} wall / CPU per request",
                     statistics.median(ratio), f"expected {per[0]['expected']:g} (at least: "
                     f"a shard waits for requests); per seed "
                     + ", ".join(f"{x:.3g}" for x in ratio)])
    return rows


def emulation_rows(arms: dict) -> list[list]:
    """Per arm, each worker's and shard's paced wall time over its CPU time (median of the
    seeds, every seed's, and the largest deviation from the expected factor / cores)."""
    rows = []
    for name, a in arms.items():
        entries = [e for e in a.get("emulation_seeds") or [] if e]
        if entries:
            rows += _worker_rows(name, entries)
    return rows


def worst_worker_deviation(arms: dict) -> float | None:
    """The largest |wall / CPU over expected - 1| of any worker in any seed of any arm."""
    devs = [abs(w["wall_per_cpu"] / w["expected"] - 1.0)
            for a in arms.values() for e in a.get("emulation_seeds") or [] if e
            for w in e["workers"] if w["expected"]]
    return max(devs) if devs else None


def label(arms: dict) -> str:
    """The EMULATED label of the runs (their summaries'), or a line saying there was none."""
    labels = {e["label"] for a in arms.values() for e in a.get("emulation_seeds") or [] if e}
    if not labels:
        return "Not emulated: all processes share the machine's cores."
    return "; ".join(sorted(labels)) + "."

