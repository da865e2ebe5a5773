"""On Ray: a sync run with a validation slice stops early by itself, and OUT/model is the
best evaluation's model (its validation log loss, scored again). Every mode: tests/harness/
test_validation_runs_harness.py. Run: .venv/bin/pytest -q tests/integration/test_validation_runs.py"""

import pytest

from recsync.data.reader import Dataset
from recsync.metrics.evaluate import evaluate
from recsync.model_dir.trained import load_model
from recsync.run.driver import run
from runs import config


def test_sync_run_stops_early_and_keeps_the_best_model(ray_cluster, data, tmp_path):
    cfg = config(data, 'mode="sync"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=40", "train.validation=0.125", "train.patience=1",
                 "train.eval_every_samples=1024", "train.eval_sample_rows=100000",
                 "train.embedding_lr=0.5", "train.dense_lr=0.05",
                 'train.dense_precision="float32"')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed", summary["error"]
    assert summary["stopped"]["reason"] == "early_stopping"
    assert summary["samples"] < 40 * 3584 and summary["queue"]["dropped"] > 0
    best = summary["stopped"]["best_eval"]
    assert best["logloss"] == min(e["logloss"] for e in summary["evals"])
    model = load_model(tmp_path / "model")
    ds = Dataset(data)
    ds.hold_out(0.125)
    again = evaluate(model.dense, model, ds, 10**9, 1024, split="validation")
    assert again["logloss"] == pytest.approx(best["logloss"], rel=1e-5)
