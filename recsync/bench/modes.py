"""Scenario `modes`: every sync mode side by side on one data set, the comparison a user asks
first: training samples/s, eval AUC and staleness of each mode, in one table and one plot.

The arms come from the mode registry (``recsync.modes.MODES``): one arm per mode, named after
it, each with N = 2 workers and S = 2 PS shards, and the mode's own settings (``[gba]``,
``[shadow]``, ``[eager]``, ``[hybrid]``, ...) at their defaults. A mode added to the registry
joins the scenario without an edit here. One more arm, ``local`` (the single-process trainer,
mode local), is the reference the speeds are read against.

Every arm: one pass over the same synthetic data set, made once for the scenario (so every arm
trains the same samples; a 2-worker arm takes half as many steps per worker as ``local``), the
default DLRM (MLPs [512, 256, 64] and [512, 256]), the default optimizers and learning rates,
batch 4096 per worker, seed 0, one intra-op thread per training process, chunks of 4 batches
(at the end of a run one worker trains alone for little time), no evaluation during training
(in mode local it would stop training; in the distributed modes it would share the driver's
CPU with the workers).
Nothing is emulated: no network latency, no straggler, no failure.

The arms alternate over ``ROUNDS`` rounds. samples/s counts the steps after a warm-up of a few
steps per worker, from each run's metrics log (as in scenario `overhead`), the median of the
rounds; AUC is the whole eval split's at the end of a run, the mean of the rounds; staleness is
summary.json's (versions a PS shard moved between a gradient's pull and its application, over
every gradient every shard applied): the mean of the rounds' means and the highest p99 and max
of the rounds. Ratios: ``<mode>_vs_local_speed`` for every mode and ``<arm>_minus_sync_auc``
for every arm but sync. The plot ``modes.png`` puts each arm at its samples/s and AUC.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from recsync.bench import overhead as ov  # noqa: E402
from recsync.bench.report import _fmt, _table  # noqa: E402
from recsync.config import RunConfig, load_config  # noqa: E402
from recsync.data.synthetic import SynthSpec  # noqa: E402
from recsync.metrics.plot import plot_runs  # noqa: E402

ROUNDS = 2
ROWS = 800_000  # training rows at --scale 1
EVAL_ROWS = 100_000
WORKERS, SHARDS, BATCH = 2, 2, 4096
CHUNK_BATCHES = 4
SEED = 0
REFERENCE = "local"  # the single-process arm every speed is divided by
QUALITY = "sync"  # the arm every AUC is compared with
COMMON = [
    f"train.batch_size={BATCH}", f"train.seed={SEED}", "train.threads=1",
    "train.eval_every_samples=1000000000000", f"data.chunk_rows={CHUNK_BATCHES * BATCH}",
    "output.progress=false", "output.plot=false", "output.log_every_steps=1",
]


def _mode_names() -> list[str]:
    """The registry's modes, in its order (``local``, if registered, is the reference arm)."""
    from recsync.modes import MODES  # here, not at import: `recsync bench` loads every scenario
    names = [name for name in MODES if name != REFERENCE]
    if not names:
        raise RuntimeError("recsync.modes.MODES holds no distributed mode: scenario `modes` "
                           "has nothing to compare")
    return names


def arm_args(name: str) -> list[str]:
    """The config overrides of arm ``name``: its mode, and 2 workers x 2 shards if distributed."""
    if name == REFERENCE:
        return [f'mode="{REFERENCE}"']
    return [f"mode={json.dumps(name)}", f"cluster.workers={WORKERS}",
            f"cluster.ps_shards={SHARDS}"]


def arm_config(data: Path, args: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *args])


def staleness_over_rounds(rounds: list[dict | None]) -> dict:
    """Mean of the rounds' mean staleness, highest p99 and max (None where no round has one,
    as in mode local)."""
    have = [s for s in rounds if s and s.get("mean") is not None]
    if not have:
        return {"mean": None, "p99": None, "max": None}
    return {"mean": statistics.mean(s["mean"] for s in have),
            "p99": max(s["p99"] for s in have), "max": max(s["max"] for s in have)}


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    modes = _mode_names()
    data = ov.make_data(out / "data", max(200_000, round(ROWS * scale)),
                        SynthSpec().max_table_rows, EVAL_ROWS)
    cfgs = {name: arm_config(data, arm_args(name)) for name in (REFERENCE, *modes)}
    runs = ov.alternate(cfgs, out, ROUNDS)
    arms = {}
    for name, results in runs.items():
        arms[name] = {**ov.arm_entry_with_mean_auc(results),
                      "staleness_rounds": [r["staleness"] for r in results],
                      "staleness_over_rounds": staleness_over_rounds(
                          [r["staleness"] for r in results])}
    plot_runs([out / "arms" / n / "round1" for n in arms], out / "quality.png",
              labels=list(arms))
    plot_modes(arms, out / "modes.png")

    def speed(name):
        return arms[name]["samples_per_s"]

    def auc(name):
        return arms[name]["eval"]["auc"]

    ratios = {f"{m}_vs_local_speed": speed(m) / speed(REFERENCE) for m in modes}
    if QUALITY in arms:
        ratios.update({f"{n}_minus_{QUALITY}_auc": auc(n) - auc(QUALITY)
                       for n in arms if n != QUALITY})
    wall_s = time.perf_counter() - started
    rows = arms[REFERENCE]["samples"]
    return {
        "scenario": "modes",
        "description": (
            f"Every mode of the registry ({', '.join(modes)}) with {WORKERS} workers x batch "
            f"{BATCH} and {SHARDS} PS shards, and `{REFERENCE}` (one process, batch {BATCH}) "
            f"as the reference; one pass over the same {rows:,} synthetic rows in every arm, "
            f"seed {SEED}; default DLRM, optimizers and learning rates; each mode's own "
            f"settings at their defaults; 1 intra-op thread per training process; chunks of "
            f"{CHUNK_BATCHES} batches. Nothing emulated (no network latency, straggler or "
            f"failure). All processes (workers, PS shards, driver, Ray's) share the machine's "
            f"{os.cpu_count()} cores. {ROUNDS} alternating rounds; samples/s after a warm-up of "
            f"{ov.WARMUP_STEPS} steps per worker (from the metrics logs), median of rounds; AUC "
            f"on the whole eval split ({EVAL_ROWS:,} rows) at the end, mean of rounds; "
            f"staleness at the PS shards over every applied gradient (summary.json), mean of "
            f"the rounds' means, highest p99 and max of the rounds; wall time of the whole run "
            f"(Ray's and the workers' start-up and the final evaluation included), median of "
            f"rounds. Scenario wall time {wall_s / 60:.1f} min.\n\n"
            "## Modes side by side\n\n" + side_by_side(arms) + "\n\n"
            "![samples/s against eval AUC, one point per arm](modes.png)\n\n"
            "`modes.png`: each arm at its samples/s (median) and eval AUC (mean); the small "
            "dots are the rounds."),
        "arms": arms,
        "ratios": ratios,
        "modes": modes,
        "wall_s": wall_s,
        "tables": {
            "Per round": [row for n, a in arms.items() for row in _round_rows(n, a)],
            "Throughput as summary.json reports it (train_s from the first step)":
                ov.summary_rows(arms, {}),
            "Start-up and measurement window (medians of rounds)": ov.timeline_rows(arms),
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def side_by_side(arms: dict) -> str:
    """The scenario's one table: a row per arm."""
    ref = arms[REFERENCE]["samples_per_s"]
    sync_auc = arms[QUALITY]["eval"]["auc"] if QUALITY in arms else None
    rows = []
    for name, a in arms.items():
        st = a["staleness_over_rounds"]
        rows.append([
            name, "1 process" if name == REFERENCE else f"{a['workers']} x {a['ps_shards']}",
            a["samples_per_s"], a["samples_per_s"] / ref, a["eval"]["auc"],
            None if sync_auc is None or name == QUALITY else a["eval"]["auc"] - sync_auc,
            "n/a" if st["mean"] is None else f"{st['mean']:.2f} / {st['p99']} / {st['max']}",
            a["wall_s"]])
    return _table(["arm", "workers x shards", "samples/s (median)", "x local speed",
                   "eval AUC (mean)", f"AUC - {QUALITY}", "staleness mean / p99 / max",
                   "wall s (median)"], rows)


def _round_rows(name: str, a: dict) -> list[list]:
    return [[f"{name}: samples/s", a["samples_per_s"],
             "rounds: " + ", ".join(f"{x:,.0f}" for x in a["rounds_samples_per_s"])],
            [f"{name}: eval AUC", a["eval"]["auc"],
             "rounds: " + ", ".join(f"{x:.4f}" for x in a["auc_rounds"])
             + f"; logloss {_fmt(a['eval'].get('logloss'))} (last round), Bayes-optimal AUC "
             + _fmt(a["eval"].get("bayes_auc"))],
            [f"{name}: staleness mean (p99, max)", a["staleness_over_rounds"]["mean"],
             "rounds: " + "; ".join("n/a" if not s or s.get("mean") is None else
                                    f"{s['mean']:.2f} ({s['p99']}, {s['max']})"
                                    for s in a["staleness_rounds"])]]


def plot_modes(arms: dict, out_png: Path) -> Path:
    """samples/s against eval AUC, a labelled point per arm (its rounds as small dots)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, a in arms.items():  # a legend, not labels: close arms would overlap
        ref = name == REFERENCE
        point, = ax.plot([a["samples_per_s"]], [a["eval"]["auc"]], ls="none",
                         marker="s" if ref else "o", ms=8,
                         label=name + (" (1 process)" if ref else ""))
        ax.plot(a["rounds_samples_per_s"], a["auc_rounds"], ls="none", marker=".", ms=4,
                alpha=0.5, color=point.get_color())
    bayes = next(iter(arms.values()))["eval"].get("bayes_auc")
    if bayes is not None:
        ax.axhline(bayes, ls="--", color="gray", lw=1, label="Bayes-optimal AUC")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set(xlabel="training samples/s (median of rounds, after warm-up)",
           ylabel="eval AUC (mean of rounds)",
           title=f"modes: {WORKERS} workers x {SHARDS} PS shards, same data")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)
