"""What a search leaves besides its table: the plot of the trials' validation log loss and the
best trial's config as a TOML for `recsync train`."""

from __future__ import annotations

from pathlib import Path

from recsync.config import RunConfig
from recsync.tuning.table import TrialTable

PLOT, BEST = "validation.png", "best.toml"


def plot_trials(table: TrialTable, path: Path) -> Path | None:
    """Validation log loss against samples trained, one line a trial, the best one bold;
    None where no trial reported an evaluation."""
    rows = [r for r in table.rows.values() if r.evals]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    best = table.best()
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in sorted(rows, key=lambda r: r.trial):
        xs = [e["samples"] for e in r.evals]
        ys = [e["logloss"] for e in r.evals]
        is_best = best is not None and r.trial == best.trial
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=2.5 if is_best else 1.0,
                alpha=1.0 if is_best else 0.6, linestyle="-" if r.status == "completed" else "--",
                color="black" if is_best else None,
                label=f"{r.trial} (best)" if is_best else None)
    ax.set_xlabel("samples trained")
    ax.set_ylabel("validation log loss")
    ax.set_title(f"{len(rows)} trials (dashed: stopped by ASHA, failed or interrupted; the "
                 f"best in black)")
    if best is not None:
        ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def best_config(base: RunConfig, values: dict) -> RunConfig:
    """The base config (as the user gave it, validation fraction included) with the best
    trial's values: what `recsync train --config` reads."""
    from recsync.api import override
    from recsync.tuning.trial import plain
    return override(base, **{k: plain(v) for k, v in values.items()})
