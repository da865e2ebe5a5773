"""train.validation and train.patience: the validation slice is the training split's last
rows, disjoint from the rows trained on and from the eval split; the periodic evaluations
score it; early stopping stops after ``patience`` evaluations without improvement; OUT/model
and the final evaluation are the best evaluation's model; summary.json says why training
stopped."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recsync.config import ConfigError, load_config
from recsync.data.holdout import cut, held_rows
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.evaluate import evaluate
from recsync.model_dir.trained import load_model
from recsync.run.driver import run
from recsync.run.selection import Selection

SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         "train.batch_size=128", "output.progress=false", "output.plot=false",
         "train.eval_sample_rows=100000"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=4000, eval_rows=500, spec=SynthSpec(seed=2, max_table_rows=200),
             processes=1, progress=False)
    return root


def config(data, *extra):
    return load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, *extra])


def _rows(ds: Dataset, split: str) -> list[tuple[int, int, int]]:
    """(split's real part file, part, row) of every row ``ds.chunks(split)`` hands out."""
    return [(c.split, c.part, r) for c in ds.chunks(split, 7) for r in range(c.start, c.stop)]


# -- the slice -------------------------------------------------------------------------------

def test_cut_takes_the_last_rows_across_parts():
    assert cut([5, 5, 3], 4) == ([(0, 0, 5), (1, 0, 4)], [(1, 4, 5), (2, 0, 3)])
    assert cut([5, 5, 3], 0) == ([(0, 0, 5), (1, 0, 5), (2, 0, 3)], [])
    assert cut([5, 5, 3], 3) == ([(0, 0, 5), (1, 0, 5)], [(2, 0, 3)])
    assert held_rows(1000, 0.05) == 50 and held_rows(10, 0.01) == 1 and held_rows(10, 0) == 0
    with pytest.raises(ValueError, match="nothing would be left to train on"):
        held_rows(3, 0.9)


def test_the_slice_is_the_training_splits_tail_disjoint_from_training_and_eval(data):
    ds = Dataset(data)
    whole = _rows(ds, "train")
    eval_rows = _rows(ds, "eval")
    ds.hold_out(0.1)
    train, valid = _rows(ds, "train"), _rows(ds, "validation")
    assert len(valid) == ds.rows("validation") == 400
    assert len(train) == ds.rows("train") == 3600
    assert not set(train) & set(valid)
    assert train + valid == whole  # in time order: the slice is the last rows
    assert all(split == "train" for split, _, _ in valid)  # never the eval split's rows
    assert _rows(ds, "eval") == eval_rows and ds.rows("eval") == 500
    # what evaluate reads of "validation" are those rows' labels
    labels = np.concatenate([ds.read(c).label.numpy() for c in ds.chunks("validation", 64)])
    assert np.array_equal(labels, np.load(data / "train" / "part-00000.label.npy")[3600:])


def test_patience_needs_a_validation_slice(data):
    with pytest.raises(ConfigError, match="train.patience = 2 needs a validation slice"):
        config(data, "train.patience=2")


# -- selection --------------------------------------------------------------------------------

def test_selection_stops_after_patience_evaluations_without_improvement():
    s = Selection(patience=2)
    losses = [0.5, 0.4, 0.45, 0.39, 0.41, float("nan")]
    stops = []
    for i, loss in enumerate(losses):
        s.observe({"logloss": loss, "samples": 100 * (i + 1)}, i)
        stops.append(s.should_stop)
    assert stops == [False, False, False, False, False, True]
    assert s.best["index"] == 3 and s.best["samples"] == 400 and s.since_best == 2
    assert not Selection(patience=0).should_stop


# -- runs -------------------------------------------------------------------------------------

def test_a_run_without_validation_says_it_trained_its_epochs(data, tmp_path):
    summary = run(config(data, "train.epochs=2", "output.save_model=false"), tmp_path / "a")
    assert summary["stopped"]["reason"] == "epochs"
    assert summary["stopped"]["best_eval"] is None
    assert summary["samples"] == 2 * 4000
    assert {e["split"] for e in summary["evals"]} == {"eval"}
    summary = run(config(data, "train.max_steps=5", "output.save_model=false"), tmp_path / "b")
    assert summary["stopped"]["reason"] == "max_steps"


def test_early_stopping_keeps_the_best_evaluations_model(data, tmp_path):
    """Far too many epochs at a high learning rate: the validation log loss stops improving,
    the run stops ``patience`` evaluations after its best, and OUT/model (and the final
    evaluation on the eval split) is the best evaluation's model."""
    out = tmp_path / "run"
    cfg = config(data, "train.epochs=40", "train.validation=0.1", "train.patience=2",
                 "train.eval_every_samples=1800", "train.embedding_lr=0.5",
                 "train.dense_lr=0.05", 'train.dense_precision="float32"')
    summary = run(cfg, out)
    stopped, evals = summary["stopped"], summary["evals"]
    assert stopped["reason"] == "early_stopping"
    assert summary["samples"] < 40 * 3600  # stopped by itself
    best = stopped["best_eval"]
    assert len(evals) == best["index"] + 1 + 2  # patience evaluations after the best
    assert all(e["split"] == "validation" and e["rows"] == 400 for e in evals)
    assert best["logloss"] == min(e["logloss"] for e in evals)
    assert best["logloss"] < evals[-1]["logloss"]  # the last model is not the kept one
    assert summary["periodic_eval"]["split"] == "validation"
    # OUT/model is the best evaluation's model: scored on the slice, its log loss
    again, final = _scored(out, data)
    assert again["logloss"] == pytest.approx(best["logloss"], rel=1e-5)
    assert final["logloss"] == pytest.approx(summary["eval"]["logloss"], rel=1e-5)  # its
    assert summary["eval"]["rows"] == 500


def test_without_patience_the_best_model_is_kept_and_the_end_is_evaluated(data, tmp_path):
    """patience 0: every epoch is trained, the end is scored on the slice too, and the model
    kept is the best of all evaluations."""
    out = tmp_path / "run"
    cfg = config(data, "train.epochs=6", "train.validation=0.1",
                 "train.eval_every_samples=5000", "train.embedding_lr=0.5",
                 'train.dense_precision="float32"')
    summary = run(cfg, out)
    evals = summary["evals"]
    assert summary["stopped"]["reason"] == "epochs" and summary["samples"] == 6 * 3600
    assert evals[-1]["samples"] == 6 * 3600  # the end, scored on the slice
    best = summary["stopped"]["best_eval"]
    assert best["logloss"] == min(e["logloss"] for e in evals)
    again, final = _scored(out, data)
    assert again["logloss"] == pytest.approx(best["logloss"], rel=1e-5)
    assert final["logloss"] == pytest.approx(summary["eval"]["logloss"], rel=1e-5)


def _scored(out, data) -> tuple[dict, dict]:
    """OUT/model scored on the whole validation slice and on the whole eval split."""
    model = load_model(out / "model")
    ds = Dataset(data)
    ds.hold_out(0.1)
    return (evaluate(model.dense, model, ds, 10**9, 1024, split="validation"),
            evaluate(model.dense, model, ds, 10**9, 1024))


def test_a_distributed_evaluation_after_training_ended_stops_nothing(monkeypatch):
    """The end's evaluation (or one that finished after the workers) may be past the patience:
    training ended by its epochs, and the summary must say so, not early stopping."""
    from types import SimpleNamespace

    from recsync.distributed.best import BestKept
    from recsync.run.selection import EARLY_STOPPING, EPOCHS

    drained = []
    queue = SimpleNamespace(drain=SimpleNamespace(remote=lambda: drained.append(1)))
    record = SimpleNamespace(evals=[], steps=10, event=lambda *a: None)
    run = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(patience=1, max_steps=0)),
                          ds=SimpleNamespace(held=5), record=record,
                          tallies=SimpleNamespace(start_unix=0.0),
                          actors=SimpleNamespace(queue=queue))
    best = BestKept(run)
    for loss in (0.5, 0.6):
        record.evals.append({"logloss": loss, "samples": 100 * len(record.evals)})
    best.observe(record.evals[0], "first")
    best.observe(record.evals[1], None, training=False)
    assert not best.stopping and best.reason() == EPOCHS and best.state == "first"
    record.evals.append({"logloss": 0.7, "samples": 300})
    monkeypatch.setattr("recsync.distributed.best.ray.get", lambda x: x)  # the fake's drain
    best.observe(record.evals[2], None)  # while training: past the patience, it stops
    assert best.stopping and best.reason() == EARLY_STOPPING and drained == [1]
