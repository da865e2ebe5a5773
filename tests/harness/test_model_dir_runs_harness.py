"""Every mode's run ends with OUT/model, and `recsync predict` on the eval split gives the
run's final evaluation: the scores in OUT/predictions.parquet (output.save_predictions, the
ones the run computed its AUC from, rows served by its store or its PS shards) and the AUC in
summary.json. Run: pytest -q tests/harness/test_model_dir_runs_harness.py"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.metrics.core import auc_logloss
from recsync.model_dir import read_model_dir
from recsync.run.driver import run
from harness_config import config

DISTRIBUTED = ["cluster.workers=2", "cluster.ps_shards=2"]


@pytest.mark.parametrize("mode", ["local", "sync", "gba", "shadow"])
def test_predict_on_the_eval_split_gives_the_runs_final_evaluation(mode, data, fake_ray,
                                                                   tmp_path):
    extra = [] if mode == "local" else DISTRIBUTED
    cfg = config(data, f'mode="{mode}"', "train.max_steps=12", "train.eval_batch_size=200",
                 "output.save_predictions=true", *extra)
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary["error"]
    files = read_model_dir(tmp_path / "run" / "model")
    assert files.meta["run"]["mode"] == mode
    if mode != "local":  # rows of both shards, by global id
        assert {int(i) % 2 for ids, _, _ in files.tables for i in ids} == {0, 1}
    result = CliRunner().invoke(main, ["predict", "--model", str(tmp_path / "run" / "model"),
                                       str(data), "--out", str(tmp_path / "p.parquet"),
                                       "--batch-size", "200"])
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "p.parquet")
    final = pq.read_table(tmp_path / "run" / "predictions.parquet")
    scores = table["score"].to_numpy()
    assert len(scores) == final.num_rows == summary["eval"]["rows"]
    assert np.abs(scores - final["score"].to_numpy()).max() <= 1e-6
    assert np.array_equal(table["label"].to_numpy(), final["label"].to_numpy())
    assert auc_logloss(table["label"].to_numpy(), scores)["auc"] == summary["eval"]["auc"]
