"""output.save_predictions: a local and a 2-worker sync run write OUT/predictions.parquet, one
row per eval row in eval-split order, from which the AUC the summary reports is recomputed.
(A local run's Ctrl-C, weights and --overwrite: tests/unit/test_predictions.py.)"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import roc_auc_score

from recsync.data.reader import Dataset
from recsync.run.driver import run
from harness_config import config


def eval_labels(data) -> np.ndarray:
    ds = Dataset(data)
    return np.concatenate([ds.read(c).label.numpy() for c in ds.chunks("eval", 1 << 20)])


@pytest.mark.parametrize("mode", ["local", "sync"])
def test_predictions_hold_the_scores_the_reported_auc_came_from(mode, data, fake_ray,
                                                                 tmp_path):
    extra = [] if mode == "local" else ["cluster.workers=2", "cluster.ps_shards=2"]
    cfg = config(data, f'mode="{mode}"', "train.max_steps=8", "output.save_predictions=true",
                 *extra)
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary["error"]
    path = tmp_path / "run" / "predictions.parquet"
    table = pq.read_table(path)
    labels = eval_labels(data)
    assert table.column_names == ["score", "label"]  # the synthetic data has no weights
    assert str(table.schema.field("score").type) == "float"
    assert table.num_rows == len(labels) == summary["eval"]["rows"]
    assert np.array_equal(table.column("label").to_numpy(), labels)  # eval-split order
    scores = table.column("score").to_numpy()
    assert roc_auc_score(labels, scores) == summary["eval"]["auc"]
    assert summary["predictions"] == {"path": str(path), "rows": len(labels)}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["predictions"] == \
        summary["predictions"]
    assert not list((tmp_path / "run").glob(".*tmp*"))

