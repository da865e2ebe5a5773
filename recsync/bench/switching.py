"""Scenario `switching`: a straggler comes and goes; sync only, gba only, and the mode controller.

The setting of scenario `stragglers` (4 workers x batch 1024, 2 PS shards, DLRM with small MLPs,
sync's hyper-parameters everywhere, one pass over the same synthetic data). Worker 0 is emulated
4x slower from T/3 to 2T/3, T being how long sync takes without a straggler, measured first on
this machine by a short calibration run (so in every arm the straggler comes after about a third
of the data and goes after about two thirds, by the clock).

Arms: ``sync_only``, ``gba_only``, ``auto`` (starts in sync; the mode controller switches to gba
when a worker's compute time per step stays over 1.5x the median for 5 s, and back when it stays
under: the defaults of ``[switching]``). Ratios ``auto_vs_sync_speed`` (samples / train_s of
summary.json: the whole run, switches and their pauses included), ``auto_minus_sync_auc``,
``auto_switches`` (the number of switches in ``auto``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from recsync.bench import overhead as ov
from recsync.bench import stragglers as st
from recsync.plot import plot_runs
from recsync.recipes import straggler_in_the_middle

ROWS = 3_000_000  # training rows at --scale 1


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    rows = max(300_000, round(ROWS * scale))
    data = st.make_data(out / "data", rows)
    print("calibrating: sync without a straggler ...", flush=True)
    with ov.embedded_ray():
        t1, t2, rate = straggler_in_the_middle(st.arm_config(data, ['mode="sync"']),
                                               out / "calibration")
    horizon_s = 3 * t1
    straggler = (f"faults.stragglers=[{{ worker = 0, factor = {st.FACTOR}, start_s = {t1:.1f}, "
                 f"end_s = {t2:.1f} }}]")
    print(f"  {rate:,.0f} samples/s: T = {horizon_s:.0f} s; worker 0 {st.FACTOR:g}x slower "
          f"(emulated) from {t1:.0f} s to {t2:.0f} s", flush=True)
    arms_cfg = {"sync_only": ['mode="sync"', straggler],
                "gba_only": ['mode="gba"', straggler],
                "auto": ['mode="sync"', "switching.auto=true", straggler]}
    cfgs = {name: st.arm_config(data, extra) for name, extra in arms_cfg.items()}
    arms = {}
    for name, cfg in cfgs.items():
        print(f"{name} ...", flush=True)
        arms[name] = ov.run_arm(cfg, out / "arms" / name, name)
        a = arms[name]
        print(f"  eval AUC {a['eval']['auc']:.4f}; modes: "
              + " -> ".join(f"{m['mode']} ({m['from_s']:.0f}-{m['to_s']:.0f} s)"
                            for m in a["modes"]), flush=True)
    plot_runs([out / "arms" / n for n in arms], out / "quality.png", labels=list(arms))
    auto, sync = arms["auto"], arms["sync_only"]
    ratios = {
        "auto_vs_sync_speed": auto["summary_samples_per_s"] / sync["summary_samples_per_s"],
        "auto_minus_sync_auc": auto["eval"]["auc"] - sync["eval"]["auc"],
        "auto_switches": float(len(auto["modes"]) - 1),
        "gba_only_vs_sync_speed": (arms["gba_only"]["summary_samples_per_s"]
                                   / sync["summary_samples_per_s"]),
        "gba_only_minus_sync_auc": arms["gba_only"]["eval"]["auc"] - sync["eval"]["auc"],
    }
    wall_s = time.perf_counter() - started
    return {
        "scenario": "switching",
        "description": (
            f"{st.WORKERS} workers x batch {st.BATCH}, {st.SHARDS} PS shards, one pass over "
            f"{rows:,} synthetic rows in every arm, the model and hyper-parameters of scenario "
            f"`stragglers`. Calibration: sync without a straggler ran at {rate:,.0f} samples/s, "
            f"so T = {horizon_s:.0f} s and worker 0 is EMULATED {st.FACTOR:g}x slower from "
            f"{t1:.0f} s to {t2:.0f} s after training starts, in every arm. Speeds are samples / "
            f"train_s of summary.json (whole runs: the pauses of switches count). All processes "
            f"share the machine's {os.cpu_count()} cores. One run per arm. Scenario wall time "
            f"{wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "stragglers_emulated": True,
        "straggler_window_s": [t1, t2],
        "wall_s": wall_s,
        "tables": {
            "Modes over time (seconds of training, from the first step)": [
                [f"{n}: {m['mode']}", f"{m['from_s']:.1f} - {m['to_s']:.1f}", m["cause"]]
                for n, a in arms.items() for m in a["modes"]],
            "Quality and speed per arm": [
                [f"{n}: eval AUC", a["eval"]["auc"],
                 f"logloss {a['eval']['logloss']:.4f}; samples / train_s "
                 f"{a['summary_samples_per_s']:,.0f}; train_s {a['train_s']:.1f}"]
                for n, a in arms.items()],
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }
