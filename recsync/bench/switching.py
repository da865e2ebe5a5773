"""Scenario `switching`: a straggler comes and goes; sync only, gba only, and the mode controller.

The EMULATED cluster and setting of scenario `stragglers` (4 workers x batch 1024, 2 PS shards,
DLRM with small MLPs, sync's hyper-parameters everywhere, one pass over the same synthetic
data). Worker 0 is an EMULATED straggler, 4x slower from T/3 to 2T/3, T being how long sync
takes without a straggler, measured first by a short calibration run on the same emulated
cluster (so in every arm the straggler comes after about a third of the data and goes after
about two thirds, by the clock).

Arms, once per seed (``--seeds``, arms interleaved; ``gba_only``, a reference, seed 0 only):
``sync_only``, ``gba_only``, ``auto``
(starts in sync; the mode controller switches to gba when a worker's compute time per step
stays over 1.5x the median for 5 s, and back when it stays under: the defaults of
``[switching]``). Ratios ``auto_vs_sync_speed`` (samples / train_s of summary.json: the whole
run, switches and their pauses included; median of seeds) beside ``ideal_auto_vs_sync_speed``
(emulated.ideal_windowed_speed_ratio: a run that keeps every worker's pace while the straggler
is present, over the share of sync_only's run the straggler is present, switching at no cost)
and their quotient ``auto_speed_vs_ideal``; ``auto_minus_sync_auc`` (mean of the paired
differences per seed), ``auto_switches`` (switches in ``auto``, mean of seeds).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench import overhead as ov
from recsync.bench import seeds as sd
from recsync.bench import stragglers as st
from recsync.metrics.plot import plot_runs
from recsync.recipes import straggler_in_the_middle

# training rows at --scale 1: the straggler's window (a third of the run) must be long against
# the controller's 5 s detection window for auto to approach its ideal
ROWS = 700_000


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    rows = max(150_000, round(ROWS * scale))
    data = st.make_data(out / "data", rows)
    print("calibrating: sync without a straggler ...", flush=True)
    with ov.embedded_ray():
        t1, t2, rate = straggler_in_the_middle(st.arm_config(data, ['mode="sync"']),
                                               out / "calibration")
    horizon_s = 3 * t1
    straggler = (f"faults.stragglers=[{{ worker = 0, factor = {st.FACTOR}, start_s = {t1:.1f}, "
                 f"end_s = {t2:.1f} }}]")
    print(f"  {rate:,.0f} samples/s: T = {horizon_s:.0f} s; worker 0 {st.FACTOR:g}x slower "
          f"(EMULATED) from {t1:.0f} s to {t2:.0f} s", flush=True)
    arms_cfg = {"sync_only": ['mode="sync"', straggler],
                "gba_only": ['mode="gba"', straggler],
                "auto": ['mode="sync"', "switching.auto=true", straggler]}
    cfgs = {name: st.arm_config(data, extra) for name, extra in arms_cfg.items()}
    runs = sd.seeded_runs(list(cfgs), cfgs.__getitem__, out, seeds, once=("gba_only",))
    for name, results in runs.items():
        for s, a in enumerate(results):
            print(f"{name} seed {s}: modes " + " -> ".join(
                f"{m['mode']} ({m['from_s']:.0f}-{m['to_s']:.0f} s)" for m in a["modes"]),
                flush=True)
    arms = {name: sd.seeded_entry(r) for name, r in runs.items()}
    plot_runs([out / "arms" / n / "seed0" for n in arms], out / "quality.png", labels=list(arms))
    auto, sync = arms["auto"], arms["sync_only"]
    factors = [st.FACTOR] + [1.0] * (st.WORKERS - 1)
    share = max(0.0, min(t2, sync["train_s"]) - t1) / sync["train_s"]
    ideals = {
        "auto_vs_sync_speed": (auto["summary_samples_per_s"] / sync["summary_samples_per_s"],
                               em.ideal_windowed_speed_ratio(factors, (t1, t2), sync["train_s"])),
        "gba_only_vs_sync_speed": (
            arms["gba_only"]["summary_samples_per_s"] / sync["summary_samples_per_s"],
            em.ideal_windowed_speed_ratio(factors, (t1, t2), sync["train_s"])),
    }
    diffs = {"auto_minus_sync_auc": sd.auc_difference(arms, "auto", "sync_only"),
             "gba_only_minus_sync_auc": sd.auc_difference(arms, "gba_only", "sync_only")}
    ratios = {
        "auto_vs_sync_speed": ideals["auto_vs_sync_speed"][0],
        "ideal_auto_vs_sync_speed": ideals["auto_vs_sync_speed"][1],
        "auto_speed_vs_ideal": ideals["auto_vs_sync_speed"][0] / ideals["auto_vs_sync_speed"][1],
        "straggler_share_of_sync_run": share,
        "auto_switches": statistics.mean(len(r["modes"]) - 1 for r in runs["auto"]),
        "gba_only_vs_sync_speed": ideals["gba_only_vs_sync_speed"][0],
        **{name: d["mean"] for name, d in diffs.items()},
    }
    worst = em.worst_worker_deviation(arms)
    if worst is not None:
        ratios["emulation_worst_worker_deviation"] = worst
    wall_s = time.perf_counter() - started
    return {
        "scenario": "switching",
        "emulation_label": em.label(arms),
        "description": (
            f"{st.WORKERS} workers x batch {st.BATCH}, {st.SHARDS} PS shards, "
            f"one pass over {rows:,} synthetic rows ({em.spec_text()}) in every arm, the model "
            f"and hyper-parameters of scenario `stragglers`. Calibration: sync without a "
            f"straggler ran at {rate:,.0f} samples/s, so T = {horizon_s:.0f} s and worker 0 is "
            f"EMULATED {st.FACTOR:g}x slower from {t1:.0f} s to {t2:.0f} s after training "
            f"starts, in every arm: {share:.0%} of sync_only's train_s (median of seeds, "
            f"{sync['train_s']:.0f} s). The ideal speed ratio is that of a run that keeps every "
            f"worker's pace while the straggler is present and switches at no cost. Speeds are "
            f"samples / train_s of summary.json (whole runs: the pauses of switches count), "
            f"median of {seeds} seeds; AUC mean of seeds, differences paired by seed. Scenario "
            f"wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "ideals": {k: {"measured": m, "ideal": i, "of_ideal": m / i}
                   for k, (m, i) in ideals.items()},
        "differences": diffs,
        "seeds": seeds,
        "stragglers_emulated": True,
        "straggler_window_s": [t1, t2],
        "wall_s": wall_s,
        "tables": {
            "AUC differences, paired by seed (mean, 95% t-interval)": [
                sd.difference_row(n, d) for n, d in diffs.items()],
            "Quality per arm": sd.auc_rows(arms),
            "Modes over time (seconds of training, from the first step)": [
                [f"{n} seed {s}: {m['mode']}", f"{m['from_s']:.1f} - {m['to_s']:.1f}",
                 m["cause"]]
                for n, results in runs.items() for s, a in enumerate(results)
                for m in a["modes"] if n == "auto" or s == 0],
            "Speed per arm": [
                [f"{n}: samples / train_s", a["summary_samples_per_s"],
                 "seeds: " + ", ".join(f"{x:,.0f}" for x in a["rounds_summary_samples_per_s"])
                 + f"; train_s (median) {a['train_s']:.1f}"]
                for n, a in arms.items()],
            "EMULATED cluster: wall time over CPU time of each process": em.emulation_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }
