"""Every mode's run ends with OUT/model, and `recsync predict` on the eval split gives the
run's final evaluation: the scores the final model gave (taken from the run's own final
evaluation, rows served by its store or its PS shards) and the AUC in summary.json.
Run: pytest -q tests/integration/test_model_dir.py"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from recsync.cli import main
from recsync.data.reader import Chunk
from recsync.metrics import auc_logloss
from recsync.model.loss import logits
from recsync.model_dir import read_model_dir
from recsync.run import run
from runs import config

MODES = {"local": [], "sync": [], "gba": [], "shadow": []}
DISTRIBUTED = ["cluster.workers=2", "cluster.ps_shards=2"]


@pytest.fixture
def final_scores(monkeypatch):
    """The scores of every evaluation the run makes (the last is its final one): the same
    batches recsync.evaluate reads, scored by the model and lookup it is given."""
    seen = []
    import recsync.distributed.handle as handle
    import recsync.local_run as local_run

    def capture(real):
        def evaluate(dense, lookup, ds, rows, batch_size):
            out, left = [], rows
            with torch.no_grad():
                for p, info in enumerate(ds.meta["splits"]["eval"]["parts"]):
                    chunk = Chunk("eval", p, 0, min(info["rows"], left))
                    for batch in ds.batches(chunk, batch_size):
                        emb = lookup.pull(batch).embeddings()
                        out.append(torch.sigmoid(logits(dense.eval(), batch, emb)).numpy())
                    left -= chunk.rows
            seen.append(np.concatenate(out))
            return real(dense, lookup, ds, rows, batch_size)
        return evaluate

    monkeypatch.setattr(local_run, "evaluate", capture(local_run.evaluate))
    monkeypatch.setattr(handle, "evaluate", capture(handle.evaluate))
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_predict_on_the_eval_split_gives_the_runs_final_evaluation(mode, data, ray_cluster,
                                                                   final_scores, tmp_path):
    extra = [] if mode == "local" else DISTRIBUTED
    cfg = config(data, f'mode="{mode}"', "train.max_steps=12", "train.eval_batch_size=200",
                 *extra)
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
    scores = table["score"].to_numpy()
    assert np.abs(scores - final_scores[-1]).max() <= 1e-6
    assert auc_logloss(table["label"].to_numpy(), scores)["auc"] == summary["eval"]["auc"]
