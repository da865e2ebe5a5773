"""End to end on real data, the README's Criteo flow: convert the first 1,000 lines of Criteo's
train.txt, train on them, score the raw file with the trained model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from recsync.cli import main
from recsync.metrics.core import read_jsonl

SAMPLE = (Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_kaggle_train_head1k"
          / "train_head1k.txt")

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_convert_and_train_on_the_criteo_sample(tmp_path):
    if not SAMPLE.is_file():
        pytest.skip(f"{SAMPLE} not found")
    runner = CliRunner()
    data, run = tmp_path / "data", tmp_path / "run"

    result = runner.invoke(main, ["data", "criteo", str(SAMPLE), "--out", str(data),
                                  "--table-size", "10000"])
    assert result.exit_code == 0, result.output
    assert "converted 1,000 lines" in result.output
    assert "900 train + 100 eval rows" in result.output
    meta = json.loads((data / "meta.json").read_text())
    assert [t["rows"] for t in meta["tables"]] == [10_000] * 26

    result = runner.invoke(main, [
        "train", "--out", str(run),
        "--set", f"data.path={json.dumps(str(data))}",
        "--set", "model.embedding_dim=8", "--set", "model.bottom_mlp=[16]",
        "--set", "model.top_mlp=[16]", "--set", "train.batch_size=32",
        "--set", "train.epochs=8", "--set", "output.progress=false",
        "--set", "output.plot=false", "--set", "output.save_predictions=true"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("completed:")

    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["samples"] == 8 * 900
    assert summary["steps"] >= 200
    assert summary["eval"]["rows"] == 100
    assert summary["eval"]["auc"] is not None and 0.0 <= summary["eval"]["auc"] <= 1.0
    assert math.isfinite(summary["eval"]["logloss"])
    assert summary["eval"]["bayes_auc"] is None  # real data: no known ceiling

    records = read_jsonl(run / "metrics.jsonl")
    losses = [r["loss"] for r in records]
    assert len(records) >= 10
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    # 900 rows seen eight times: the model fits the training set well below its first loss
    assert min(losses[-3:]) < 0.8 * losses[0]

    # the raw file scored by the trained model: its last 100 lines are the eval rows, whose
    # scores the run wrote
    scores = tmp_path / "p.parquet"
    result = runner.invoke(main, ["predict", "--model", str(run / "model"), str(SAMPLE),
                                  "--out", str(scores)])
    assert result.exit_code == 0, result.output
    got = pq.read_table(scores).column("score").to_numpy()
    want = pq.read_table(run / "predictions.parquet").column("score").to_numpy()
    assert len(got) == 1000 and len(want) == 100
    assert float(np.abs(got[-100:] - want).max()) <= 1e-6
