"""Distributed runs with a validation slice (train.validation) and early stopping
(train.patience): the evaluations during training score the slice, the run stops by itself
(the work queue drained), and OUT/model and the final evaluation are the best evaluation's
model. Run: pytest -q tests/harness/test_validation_runs_harness.py"""

import pytest

from recsync.data.reader import Dataset
from recsync.metrics.core import read_jsonl
from recsync.metrics.evaluate import evaluate
from recsync.model_dir.trained import load_model
from recsync.run.driver import run
from harness_config import config


@pytest.mark.parametrize("mode", ["async", "sync", "gba", "hybrid", "shadow", "foreground", "eager"])
def test_distributed_run_stops_early_and_keeps_the_best_model(fake_ray, data, tmp_path, mode):
    # far too many epochs at a high learning rate: the validation log loss stops improving;
    # an emulated 10 ms per PS call keeps training going for several polls of the watch loop
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=40", "train.validation=0.125", "train.patience=1",
                 "train.eval_every_samples=1024", "train.eval_sample_rows=100000",
                 "train.embedding_lr=0.5", "train.dense_lr=0.05", "network.latency_ms=10",
                 'train.dense_precision="float32"')
    told = []  # run()'s on_eval hook (recsync tune's reports): every validation evaluation
    summary = run(cfg, tmp_path, on_eval=told.append)
    assert summary["status"] == "completed", summary["error"]
    stopped, evals = summary["stopped"], summary["evals"]
    assert [(t["samples"], t["logloss"]) for t in told] == \
        [(e["samples"], e["logloss"]) for e in evals]
    assert stopped["reason"] == "early_stopping"
    assert summary["samples"] < 40 * 3584 and summary["queue"]["dropped"] > 0
    assert all(e["split"] == "validation" and e["rows"] == 512 for e in evals)
    best = stopped["best_eval"]
    assert best["logloss"] == min(e["logloss"] for e in evals)
    events = [e["event"] for r in read_jsonl(tmp_path / "metrics.jsonl") for e in r["events"]]
    assert any(e.startswith("early stopping: 1 evaluation without") for e in events)
    model = load_model(tmp_path / "model")
    ds = Dataset(data)
    ds.hold_out(0.125)
    again = evaluate(model.dense, model, ds, 10**9, 1024, split="validation")
    assert again["logloss"] == pytest.approx(best["logloss"], rel=1e-5)
    final = evaluate(model.dense, model, ds, 10**9, 1024)
    assert final["logloss"] == pytest.approx(summary["eval"]["logloss"], rel=1e-5)
