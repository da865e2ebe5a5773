"""output.save_predictions in a local run: OUT/predictions.parquet holds the final evaluation's
scores (also when Ctrl-C stopped the run), with the weights of weighted data; --overwrite
removes an earlier run's file. The distributed runs: tests/harness/test_predictions_runs_harness.py."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.metrics import roc_auc_score

import recsync
from recsync.config import load_config
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.evaluate import evaluate
from recsync.run import local_run
from recsync.run.driver import run
from recsync.run.signals import Interrupted


@pytest.fixture(scope="module", autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=600, eval_rows=200, spec=SynthSpec(seed=2, max_table_rows=100),
             processes=1, progress=False)
    return root


def config(data, *extra):
    return load_config(None, [
        f"data.path={json.dumps(str(data))}", "model.embedding_dim=4", "model.bottom_mlp=[8]",
        "model.top_mlp=[8]", "train.batch_size=50", "output.progress=false",
        "output.plot=false", *extra])


def eval_split(data):
    ds = Dataset(data)
    return [ds.read(c) for c in ds.chunks("eval", 1 << 20)]


def test_evaluate_keeps_the_scores_its_metrics_came_from(data):
    ds = Dataset(data)
    m = local_run.build_local_model(config(data).model, config(data).train, ds)
    plain = evaluate(m.dense, m.lookup, ds, 150, 64)
    kept = evaluate(m.dense, m.lookup, ds, 150, 64, keep_scores=True)
    assert "scores" not in plain and set(kept) == set(plain) | {"scores", "labels"}
    assert kept["scores"].dtype == np.float32 and len(kept["scores"]) == 150
    assert np.array_equal(kept["labels"], eval_split(data)[0].label.numpy()[:150])
    assert roc_auc_score(kept["labels"], kept["scores"]) == plain["auc"]


def test_a_run_stopped_by_ctrl_c_saves_the_predictions_of_its_evaluation(data, tmp_path,
                                                                         monkeypatch):
    real, steps = local_run.train_step, []

    def step(model, batch):
        if len(steps) == 3:
            raise KeyboardInterrupt
        steps.append(1)
        return real(model, batch)

    monkeypatch.setattr(local_run, "train_step", step)
    with pytest.raises(Interrupted):
        run(config(data, "output.save_predictions=true"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    table = pq.read_table(tmp_path / "predictions.parquet")
    assert summary["predictions"]["rows"] == table.num_rows == summary["eval"]["rows"] == 200
    auc = roc_auc_score(table.column("label").to_numpy(), table.column("score").to_numpy())
    assert auc == summary["eval"]["auc"]


def test_weighted_data_keeps_its_weights(tmp_path):
    rng = np.random.default_rng(0)
    lines = ["y,w,x,c"] + [f"{rng.integers(2)},{rng.uniform(0, 2):.3f},{rng.normal():.3f},"
                           f"c{rng.integers(20)}" for _ in range(300)]
    (tmp_path / "in.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "s.toml").write_text('weight = "w"\n[label]\ncolumn = "y"\n[[dense]]\n'
                                     'name = "x"\n[[categorical]]\nname = "c"\n'
                                     '[defaults]\ntable_rows = 50\n')
    recsync.convert(tmp_path / "in.csv", tmp_path / "data", schema=tmp_path / "s.toml",
                    progress=False)
    summary = run(config(tmp_path / "data", "train.max_steps=2",
                         "output.save_predictions=true"), tmp_path / "run")
    table = pq.read_table(tmp_path / "run" / "predictions.parquet")
    assert table.column_names == ["score", "label", "weight"] and table.num_rows == 30
    want = eval_split(tmp_path / "data")[0]
    assert np.array_equal(table.column("weight").to_numpy(), want.weight.numpy())
    assert summary["predictions"]["rows"] == 30


def test_no_predictions_unless_asked_and_overwrite_removes_old_ones(data, tmp_path):
    out = tmp_path / "run"
    run(config(data, "train.max_steps=2", "output.save_predictions=true"), out)
    assert (out / "predictions.parquet").exists()
    summary = run(config(data, "train.max_steps=2"), out, overwrite=True)
    assert summary["predictions"] is None
    assert not (out / "predictions.parquet").exists()  # not a stale file of the earlier run
