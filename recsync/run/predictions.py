"""OUT/predictions.parquet (``output.save_predictions``): the final evaluation's scores, so a user
can recompute the AUC the run reported, or check a loaded model against them.

Columns, in eval-split order: ``score`` (float32, the predicted click probability: the very
array the summary's AUC and log loss were computed from), ``label`` (float32) and, where the
data has weights, ``weight``. Written to a temporary name beside it, synced, then renamed: a
reader never sees a partial file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

FILE = "predictions.parquet"


def take_scores(result: dict) -> dict | None:
    """Remove the arrays ``evaluate(keep_scores=True)`` added from an evaluation's result
    (they do not go into summary.json) and return them, or None if there are none."""
    if not result or "scores" not in result:
        return None
    return {k: result.pop(k) for k in ("scores", "labels", "weights") if k in result}


def write_predictions(out: Path, arrays: dict) -> dict:
    """Write ``arrays`` (``take_scores``' answer) to ``out``/predictions.parquet atomically;
    returns summary.json's ``predictions``: {"path", "rows"}."""
    path = Path(out) / FILE
    columns = {"score": pa.array(arrays["scores"], pa.float32()),
               "label": pa.array(arrays["labels"], pa.float32())}
    if arrays.get("weights") is not None:
        columns["weight"] = pa.array(arrays["weights"], pa.float32())
    table = pa.table(columns)
    tmp = path.with_name(f".{FILE}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"path": str(path), "rows": table.num_rows}


def save_predictions(out: Path, result: dict) -> dict | None:
    """The final evaluation's predictions (in ``result["eval"]`` if it kept its scores) written
    to ``out``; the arrays leave ``result``. None if there are none, or (with a warning on
    stderr) if the file cannot be written: the run's other outputs still are."""
    arrays = take_scores(result.get("eval") or {})
    if arrays is None:
        return None
    try:
        return write_predictions(out, arrays)
    except OSError as e:
        print(f"warning: could not write {Path(out) / FILE} ({e.strerror or e})",
              file=sys.stderr)
        return None
