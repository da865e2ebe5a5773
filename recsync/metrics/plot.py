"""`recsync plot RUN_DIR...`: training loss and eval AUC against samples and time, one PNG."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from recsync.metrics.core import read_jsonl  # noqa: E402


def _load(run: Path) -> tuple[list[dict], dict | None]:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{metrics}: missing; is {run} the --out directory of a run?")
    summary = run / "summary.json"
    return read_jsonl(metrics), json.loads(summary.read_text()) if summary.is_file() else None


def _shade_switched_modes(ax, summary: dict | None, color, label: str) -> None:
    """On the loss-against-seconds panel, shade the periods a run that switched modes spent in
    each mode other than its first (e.g. gba between two periods of sync)."""
    modes = (summary or {}).get("modes") or []
    for m in modes[1:]:
        if m["mode"] != modes[0]["mode"]:
            ax.axvspan(m["from_s"], m["to_s"], color=color, alpha=0.12, lw=0,
                       label=f"{label}: {m['mode']}")


def _worker_count(ax, records: list[dict], color, label: str) -> None:
    """An elastic run's workers over time, on a right-hand axis of the loss-against-seconds
    panel (a run whose count never changed draws nothing)."""
    points = [(r["time_s"], r["workers"]) for r in records if r.get("workers") is not None]
    if len({n for _, n in points}) < 2:
        return
    twin = ax.twinx()
    twin.step([t for t, _ in points], [n for _, n in points], where="post", color=color,
              ls=":", lw=1.2, label=f"{label}: workers")
    twin.set_ylabel("workers training")
    twin.set_ylim(0, max(n for _, n in points) + 1)
    twin.legend(fontsize=8, loc="upper right")


def plot_runs(runs: list[Path], out_png: Path, labels: list[str] | None = None) -> Path:
    """Draw every run into one 2x2 figure (loss and AUC, against samples and seconds)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    bayes_drawn = simulated = False
    for i, run in enumerate(runs):
        records, summary = _load(Path(run))
        label = labels[i] if labels else Path(run).name
        if (summary or {}).get("label") == "SIMULATED":  # recsync simulate: its clock's
            label += " (SIMULATED)"
            simulated = True
        train = [r for r in records if r.get("loss") is not None]
        evals = [r["eval"] for r in records if r.get("eval")]
        final = (summary or {}).get("eval", {})
        scored = ("validation slice" if evals and evals[0].get("split") == "validation"
                  else "eval sample")
        for col, x in enumerate(("samples", "time_s")):
            line, = axes[0, col].plot([r[x] for r in train], [r["loss"] for r in train],
                                      label=label, lw=1)
            axes[1, col].plot([e[x] for e in evals], [e["auc"] for e in evals], marker="o",
                              ms=3, color=line.get_color(), label=f"{label} ({scored})")
            if final.get("auc") is not None:
                at = summary["samples"] if x == "samples" else max(
                    (r["time_s"] for r in records), default=0.0)
                axes[1, col].plot([at], [final["auc"]], marker="*", ms=11, ls="none",
                                  color=line.get_color(),
                                  label=f"{label} final ({final['rows']:,} eval rows)")
            bayes = (summary or {}).get("eval", {}).get("bayes_auc")
            if bayes is not None and not bayes_drawn:
                axes[1, col].axhline(bayes, ls="--", color="gray", lw=1, label="Bayes-optimal")
        bayes_drawn = bayes_drawn or bool((summary or {}).get("eval", {}).get("bayes_auc"))
        _shade_switched_modes(axes[0, 1], summary, line.get_color(), label)
        _worker_count(axes[0, 1], records, line.get_color(), label)
    seconds = ("SIMULATED seconds of training" if simulated
               else "seconds of training (from the first step)")
    for col, xlabel in enumerate(("training samples", seconds)):
        axes[0, col].set(xlabel=xlabel, ylabel="training log loss (interval mean)")
        axes[1, col].set(xlabel=xlabel, ylabel="eval AUC")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if simulated:
        fig.suptitle("SIMULATED runs: their seconds are simulated seconds (recsync simulate)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return Path(out_png)
