"""results.json, report.md and throughput plot of a benchmark run."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from recsync.metrics.core import write_json  # noqa: E402


def environment() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__,
            "command": "recsync " + shlex.join(sys.argv[1:]) if sys.argv else ""}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return "" if v is None else str(v)


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out: Path, results: dict) -> None:
    """Write results.json, report.md and throughput.png for one scenario run. Arms whose
    ``samples_per_s`` is None (no training: scenario ps) are left out of the plot and the
    arms' table; a scenario without any writes neither."""
    results.setdefault("environment", environment())
    write_json(out / "results.json", results)
    arms = {n: a for n, a in results["arms"].items() if a.get("samples_per_s") is not None}
    runs = "seed" if results.get("seeds") else "round"
    speed = results.get("speed_statistic", "median")  # over the rounds or seeds
    if arms:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = list(arms)
        ax.bar(names, [arms[n]["samples_per_s"] for n in names], color="tab:blue")
        ax.set(ylabel=f"training samples/s ({speed} of {runs}s)", title=f"{results['scenario']}")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)

    env = results["environment"]
    md = [f"# Benchmark `{results['scenario']}`", "",
          f"{env['date']}, {env['cpu']} ({env['cores']} cores), Python {env['python']}, "
          f"torch {env['torch']}, numpy {env['numpy']}.", "",
          f"Command: `{env['command']}`", ""]
    if results.get("emulation_label"):
        md += [f"**{results['emulation_label']}**", ""]
    if results.get("description"):
        md += [results["description"], ""]
    md += [] if not arms else ["## Arms", "", _table(
        ["arm", f"samples/s ({speed})", f"samples/s per {runs}",
         "eval AUC" + (" (mean of seeds)" if results.get("seeds") else ""), "eval rows"],
        [[n, a["samples_per_s"], ", ".join(f"{x:,.0f}" for x in a.get("rounds_samples_per_s", [])),
          (a.get("eval") or {}).get("auc"), (a.get("eval") or {}).get("rows")]
         for n, a in arms.items()]), ""]
    md += ["## Ratios (measured in this run)", "",
           _table(["ratio", "value"], [[k, v] for k, v in results["ratios"].items()]), ""]
    if results.get("ideals"):
        md += ["## Measured against ideal", "", _table(
            ["ratio", "measured", "ideal", "measured / ideal"],
            [[k, v["measured"], v["ideal"], v["of_ideal"]]
             for k, v in results["ideals"].items()]), ""]
    for title, rows in results.get("tables", {}).items():
        md += [f"## {title}", "", _table(["measurement", "value", "note"], rows), ""]
    if results.get("configs"):
        md += ["## Configs", ""]
        for name, text in results["configs"].items():
            md += [f"`{name}`:", "", "```toml", text.rstrip(), "```", ""]
    plots = (["`throughput.png`"] if arms else []) + [
        f"`{name}`" for name in ("quality.png", "saturation.png") if (out / name).exists()]
    md += [f"Plots: {', '.join(plots)}", ""] if plots else []
    (out / "report.md").write_text("\n".join(md))
