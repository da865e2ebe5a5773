"""Quality metrics (AUC, log loss, NE, calibration) and the run's output files: metrics.jsonl
(with an optional TensorBoard sink beside it) and summary.json."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score

from recsync.cluster import storage

EPS = 1e-7  # probabilities are clipped to [EPS, 1 - EPS] for the log loss


def binary_entropy(p: float) -> float:
    """Entropy (nats) of a coin that lands 1 with probability ``p``; 0 at p = 0 or 1."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def auc_logloss(labels: np.ndarray, probs: np.ndarray, weights: np.ndarray | None = None) -> dict:
    """AUC, mean log loss, NE and calibration of predicted click probabilities.

    NE (normalized entropy) = log loss / entropy of the eval CTR: the log loss over that of
    always predicting the CTR (below 1: better than the constant). Calibration = mean
    prediction / CTR (1: as many clicks predicted as happened). With ``weights`` (the data
    set's weight column) every mean, the CTR and the AUC are weighted, as the training loss is.
    Where the labels are all one class, AUC and NE are NaN (null in JSON) and ``note`` says why;
    calibration is NaN only where the CTR is 0."""
    labels = np.asarray(labels, dtype=np.float64)
    raw = np.asarray(probs, dtype=np.float64)
    probs = np.clip(raw, EPS, 1 - EPS)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if len(labels) == 0 or (w is not None and not w.sum() > 0):
        return {"auc": math.nan, "logloss": math.nan, "ne": math.nan, "calibration": math.nan,
                "ctr": math.nan, "rows": int(len(labels)), "note": "no eval rows (or weights)"}
    ctr = float(np.average(labels, weights=w))
    both = 0.0 < ctr < 1.0  # both classes (with weight)
    logloss = float(log_loss(labels, probs, labels=[0, 1], sample_weight=w))
    out = {"auc": float(roc_auc_score(labels, probs, sample_weight=w)) if both else math.nan,
           "logloss": logloss,
           "ne": logloss / binary_entropy(ctr) if both else math.nan,
           "calibration": float(np.average(raw, weights=w)) / ctr if ctr > 0 else math.nan,
           "ctr": ctr, "rows": int(len(labels))}
    if not both:
        out["note"] = (f"the eval labels are all {ctr:g} (one class): AUC and NE are undefined"
                       + ("" if ctr > 0 else ", and so is calibration (CTR 0)"))
    return out


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
    """Appends one JSON object per line to ``metrics.jsonl``, flushed at once (crash-safe);
    with ``tensorboard`` (a directory), also TensorBoard event files of the same records
    (recsync/metrics/tb_sink.py). A file in a URL's staging folder (recsync/cluster/storage.py) goes
    up at most every ``upload_every_s`` (``output.upload_every_s``) as it grows, so that a run whose
    machine is lost leaves its record at the URL up to then (``--resume`` elsewhere appends
    to it)."""

    def __init__(self, path: Path, tensorboard: Path | None = None,
                 upload_every_s: float = 60.0):
        self.path = Path(path)
        self._f = open(self.path, "a", buffering=1)
        self._tb = None
        if tensorboard is not None:
            from recsync.metrics.tb_sink import TensorBoardSink
            self._tb = TensorBoardSink(tensorboard)
        self.url = storage.remote_of(self.path)
        self.upload_every_s = upload_every_s
        self.uploaded = time.monotonic()  # the run's start pushed config.toml just now
        self.upload_error: str | None = None  # the last upload's, if it failed

    def write(self, record: dict) -> None:
        record = _clean(record)
        self._f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            self._tb.write(record)
        if self.url is not None and time.monotonic() - self.uploaded >= self.upload_every_s:
            self.upload()

    def upload(self) -> None:
        """The file to its URL now. A failure is said once (the run goes on; the end of the
        run uploads every output again) and tried again at the next interval."""
        self.uploaded = time.monotonic()
        try:
            storage.push([self.path])
        except Exception as e:  # noqa: BLE001 - any filesystem's error: the run goes on
            if self.upload_error is None:
                print(f"warning: could not upload {self.path.name} to {self.url} ({e}); "
                      f"trying again every {self.upload_every_s:.0f} s", file=sys.stderr)
            self.upload_error = str(e)
        else:
            self.upload_error = None

    def final_eval(self, ev: dict | None, samples: int) -> None:
        """The final evaluation (summary.json's ``eval``): TensorBoard's ``final/...``."""
        if self._tb is not None and ev:
            self._tb.write_eval("final", _clean(ev), samples)

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


def write_json(path: Path, obj: dict) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
