"""Quality metrics (AUC, log loss) and the run's output files: metrics.jsonl and summary.json."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score


def auc_logloss(labels: np.ndarray, probs: np.ndarray) -> dict:
    """AUC and mean log loss of predicted click probabilities; AUC is NaN with one class only."""
    labels = np.asarray(labels, dtype=np.float64)
    probs = np.clip(np.asarray(probs, dtype=np.float64), 1e-7, 1 - 1e-7)
    both = 0 < labels.sum() < len(labels)
    return {"auc": float(roc_auc_score(labels, probs)) if both else math.nan,
            "logloss": float(log_loss(labels, probs, labels=[0, 1])),
            "rows": int(len(labels))}


def _clean(value):
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


class MetricsLog:
    """Appends one JSON object per line to ``metrics.jsonl``, flushed at once (crash-safe)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = open(self.path, "a", buffering=1)

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(_clean(record)) + "\n")

    def close(self) -> None:
        self._f.close()


def write_json(path: Path, obj: dict) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
