"""What the seeded scenarios share: the EMULATED cluster they run on, the synthetic data set they
train on, the ideal speed ratios they are held against, and the report rows that check the
emulation (each process's wall time over its CPU time against 1 / its cores).
"""

from __future__ import annotations

import statistics
from dataclasses import fields
from pathlib import Path

from recsync.data.synthetic import SynthSpec

# The seeded scenarios' data set: a smaller teacher than the default, whose gap to the Bayes AUC
# in one short pass is the smallest of the variants measured (docs/benchmarks/
# 2026-11-23-bench-data.md): pairwise interactions among two small tables instead of eight,
# tables of at most 1,000 ids and a steeper Zipf law (ids seen more often). With the default
# teacher, a one-pass model ended 0.045-0.067 short of the ceiling; with this one, 0.017 at
# 300,000 rows (mode local, batch 4096; 0.019 in mode sync, 4 x 1024) and 0.009 at 1,000,000.
BENCH_SPEC = SynthSpec(max_table_rows=1_000, zipf_exponent=1.3, interacting_tables=(4, 5))
TOLERANCE = 0.10  # how far wall / CPU may be from 1 / cores before the report flags it


def spec_text(spec: SynthSpec = BENCH_SPEC) -> str:
    """The fields of ``spec`` that differ from SynthSpec's defaults, for reports."""
    default = SynthSpec()
    changed = [f"{f.name}={getattr(spec, f.name)!r}" for f in fields(SynthSpec)
               if getattr(spec, f.name) != getattr(default, f.name)]
    return "SynthSpec(" + ", ".join(changed) + ")"


def make_data(path: Path, rows: int, eval_rows: int) -> Path:
    """BENCH_SPEC's data set with ``rows`` training and ``eval_rows`` eval rows."""
    print(f"generating {rows:,} + {eval_rows:,} synthetic rows ({spec_text()}) ...", flush=True)
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


def _deviation(worker: dict) -> float | None:
    """|compute wall / CPU over expected - 1| of a worker's line of summary.json's emulation."""
    ratio, expected = worker.get("compute_wall_per_cpu"), worker.get("expected")
    return abs(ratio / expected - 1.0) if ratio and expected else None


def _series(values: list) -> str:
    return ", ".join("n/a" if v is None else f"{v:.3g}" for v in values)


def _worker_rows(name: str, entries: list[dict]) -> list[list]:
    rows = []
    for rank in sorted({w["rank"] for e in entries for w in e["workers"]}):
        per = [w for e in entries for w in e["workers"] if w["rank"] == rank]
        compute = [w.get("compute_wall_per_cpu") for w in per]
        devs = [d for d in map(_deviation, per) if d is not None]
        dev = max(devs) if devs else None
        known = [x for x in compute if x is not None]
        rows.append([f"{name}: worker {rank} wall / CPU of its compute",
                     statistics.median(known) if known else None,
                     f"expected {_series([w.get('expected') for w in per])} (straggler factor "
                     f"/ cores); per seed {_series(compute)}"
                     + ("" if dev is None else f"; largest deviation {dev:.1%}"
                        + ("" if dev <= TOLERANCE else f" (more than {TOLERANCE:.0%})"))
                     + "; whole steps (waits included) "
                     + _series([w.get("wall_per_cpu") for w in per])])
    for shard in sorted({s["shard"] for e in entries for s in e["shards"]}):
        per = [s for e in entries for s in e["shards"] if s["shard"] == shard]
        ratio = [s.get("wall_per_cpu") for s in per]
        known = [x for x in ratio if x is not None]
        rows.append([f"{name}: PS shard {shard} service time / CPU",
                     statistics.median(known) if known else None,
                     f"expected {per[0]['expected']:g} (1 / cores); per seed {_series(ratio)}"])
    return rows


def emulation_rows(arms: dict) -> list[list]:
    """Per arm, each worker's paced wall time over its CPU time in its compute sections (median
    of the seeds, every seed's, and the largest deviation from the expected factor / cores;
    whole steps beside, whose waits for others make them longer), and each shard's."""
    rows = []
    for name, a in arms.items():
        entries = [e for e in a.get("emulation_seeds") or [] if e]
        if entries:
            rows += _worker_rows(name, entries)
    return rows


def worst_worker_deviation(arms: dict) -> float | None:
    """The largest |compute wall / CPU over expected - 1| of any worker in any seed of any arm."""
    devs = [_deviation(w) for a in arms.values() for e in a.get("emulation_seeds") or [] if e
            for w in e["workers"]]
    devs = [d for d in devs if d is not None]
    return max(devs) if devs else None


def label(arms: dict) -> str:
    """The EMULATED label of the runs (their summaries'), or a line saying there was none."""
    labels = {e["label"] for a in arms.values() for e in a.get("emulation_seeds") or [] if e}
    if not labels:
        return "Not emulated: all processes share the machine's cores."
    return "; ".join(sorted(labels)) + "."

