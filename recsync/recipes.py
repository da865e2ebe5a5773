"""Named full runs as short functions. ``quickstart`` is the README's main job."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from recsync.config import load_config
from recsync.data.synthetic import SynthSpec, generate

QUICKSTART_ROWS = 6_000_000
QUICKSTART_OVERRIDES = [
    "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]",
    "train.batch_size=1024", "train.threads=2",
]


def ensure_synthetic(out: Path, rows: int, spec: SynthSpec = SynthSpec()) -> Path:
    """Generate a synthetic data set into ``out`` unless the same one is already there."""
    meta = out / "meta.json"
    if meta.is_file():
        m = json.loads(meta.read_text())
        if (m.get("source", {}).get("spec") == asdict(spec)
                and m["splits"]["train"]["rows"] == rows):
            print(f"reusing synthetic data in {out}")
            return out
    r = generate(out, rows=rows, spec=spec, overwrite=True)
    print(f"generated {r.train_rows:,} + {r.eval_rows:,} rows in {r.seconds:.1f} s "
          f"({r.rows_per_s:,.0f} rows/s); Bayes-optimal eval AUC {r.bayes_auc:.4f}")
    return out


def quickstart(out: Path) -> dict:
    """Synthetic data with a known Bayes AUC, then DLRM trained locally for one pass."""
    from recsync.driver import run
    data = ensure_synthetic(out / "data", QUICKSTART_ROWS)
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *QUICKSTART_OVERRIDES])
    return run(cfg, out / "run", overwrite=True)  # rerunning the quickstart replaces it
