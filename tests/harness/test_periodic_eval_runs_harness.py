"""Distributed runs evaluate while they train: eval records in metrics.jsonl before the final
evaluation, with AUC, NE and calibration, and summary.json says the workers never paused.
Run: pytest -q tests/harness/test_periodic_eval_runs_harness.py"""

import importlib.util

import pytest

from recsync.metrics.core import read_jsonl
from recsync.run.driver import run
from harness_config import config

TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def test_async_run_evaluates_while_training(fake_ray, data, tmp_path):
    # 2 x 4,096 rows, 2 workers of batch 64; an emulated 40 ms per PS call keeps training going
    # for several polls of the watch loop (0.5 s), so that several evaluations fit in
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=2",
                 "train.eval_every_samples=512", "train.eval_sample_rows=256",
                 "network.latency_ms=40",
                 f"output.tensorboard={str(TENSORBOARD).lower()}")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed", summary["error"]
    records = read_jsonl(tmp_path / "metrics.jsonl")
    evals = [r["eval"] for r in records if r["eval"]]
    assert len(evals) >= 2
    for e in evals:
        assert e["rows"] == 256
        assert 0 < e["auc"] < 1 and 0 < e["ne"] and 0 < e["calibration"]
        assert 0 < e["samples"] <= summary["samples"]
    assert [e["samples"] for e in evals] == sorted(e["samples"] for e in evals)
    assert summary["evals"] == evals
    periodic = summary["periodic_eval"]
    assert periodic["paused_s"] == 0.0  # the workers never wait for an evaluation
    assert periodic["eval_s"] > 0 and periodic["count"] == len(evals)
    assert periodic["every_samples"] == 512 and periodic["skipped"] == 0
    final = summary["eval"]
    assert final["rows"] == 512 and final["ne"] > 0 and final["calibration"] > 0
    staleness = [r["staleness"] for r in records if r["staleness"]]  # per interval
    assert staleness and all(s["mean"] >= 0 and s["max"] >= s["mean"] for s in staleness)
    if TENSORBOARD:  # the same figures in OUT/tb/, at the same steps
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(str(tmp_path / "tb"))
        acc.Reload()
        assert [(e.step, e.value) for e in acc.Scalars("eval/ne")] == [
            (x["samples"], pytest.approx(x["ne"])) for x in evals]
        assert len(acc.Scalars("train/staleness_mean")) == len(staleness)
