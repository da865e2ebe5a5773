"""train.init_from in the local run (recsync/run/warm_start.py): a model directory's parameters
and optimizer state are what the first step starts from; a model that does not fit this run is
refused in one line."""

import json

import pytest
import torch

from model_dirs import write_model_dir
from recsync.config import load_config
from recsync.data.reader import Dataset, chunk_order
from recsync.data.synthetic import SynthSpec, generate
from recsync.modes.handover import to_flat
from recsync.run.driver import run
from recsync.run.local_run import CHUNK_BATCHES, build_local_model, final_eval, train_step
from recsync.run.warm_start import apply_local, load_warm_start

B = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=1024, eval_rows=256, spec=SynthSpec(seed=3, max_table_rows=200),
             processes=1, progress=False)
    return root


def _cfg(data, *extra):
    return load_config(None, [f"data.path={json.dumps(str(data))}", "model.embedding_dim=4",
                              "model.bottom_mlp=[8]", "model.top_mlp=[8]",
                              f"train.batch_size={B}", "output.progress=false",
                              "output.plot=false", *extra])


def _first_batches(cfg, ds, n):
    seed = cfg.train.seed
    chunks = ds.chunks("train", CHUNK_BATCHES * B)
    chunk = next(iter(chunk_order(chunks, epoch=0, shuffle_seed=seed)))
    batches = ds.batches(chunk, B, shuffle_seed=seed, epoch=0)
    return [next(batches) for _ in range(n)]


@pytest.fixture(scope="module")
def saved(data, tmp_path_factory):
    """A model trained 3 steps, written as a model directory with its optimizer state."""
    cfg, ds = _cfg(data), Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    for batch in _first_batches(cfg, ds, 3):
        train_step(model, batch)
    path = tmp_path_factory.mktemp("saved") / "model"
    return path, write_model_dir(path, cfg, model)


def test_the_model_takes_the_saved_rows_state_and_dense_parameters(data, saved):
    path, written = saved
    cfg = _cfg(data, f"train.init_from={json.dumps(str(path))}", "train.seed=5",
               "train.dense_lr=0.003")
    ds = Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    apply_local(model, load_warm_start(cfg, ds), cfg)
    store = model.lookup.store
    for t, (ids, rows, state) in enumerate(written["tables"]):
        assert len(ids) > 0
        assert torch.equal(store.pull(t, ids), rows)
        assert torch.equal(store.state[t][ids], state)
    for key, value in written["dense"].items():
        assert torch.equal(model.dense.state_dict()[key], value), key
    params = list(model.dense.parameters())
    flat = to_flat(model.dense_optimizer.state_dict(), [p.shape for p in params])
    assert torch.equal(flat["state"][0]["sum"], written["optimizer"]["sum"])
    assert model.dense_optimizer.param_groups[0]["lr"] == 0.003  # this run's


def test_a_local_run_takes_its_first_step_from_the_saved_parameters(data, saved, tmp_path):
    path, _ = saved
    cfg = _cfg(data, f"train.init_from={json.dumps(str(path))}", "train.max_steps=1",
               "train.seed=5")
    summary = run(cfg, tmp_path / "run")
    ds = Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    apply_local(model, load_warm_start(cfg, ds), cfg)
    train_step(model, _first_batches(cfg, ds, 1)[0])
    assert summary["eval"]["logloss"] == pytest.approx(final_eval(cfg, ds, model)["logloss"],
                                                       abs=1e-7)
    cold = run(_cfg(data, "train.max_steps=1", "train.seed=5"), tmp_path / "cold")
    assert cold["eval"]["logloss"] != pytest.approx(summary["eval"]["logloss"], abs=1e-4)


@pytest.mark.parametrize("extra,message", [
    (["model.embedding_dim=8"], "model.embedding_dim is 4 in the model, 8 in this run"),
    (["model.top_mlp=[16]"], "model.top_mlp is [8] in the model, [16] in this run"),
    (['train.embedding_optimizer="sgd"'],
     "table C1's optimizer state has 1 values a row in the model"),
    (['train.dense_optimizer="adam"'], "the model's dense optimizer state is 'adagrad''s"),
])
def test_a_model_that_does_not_fit_is_refused_in_one_line(data, saved, extra, message):
    path, _ = saved
    cfg = _cfg(data, f"train.init_from={json.dumps(str(path))}", *extra)
    with pytest.raises(ValueError, match="train.init_from = .*: " + message.replace(
            "[", r"\[").replace("]", r"\]")) as e:
        load_warm_start(cfg, Dataset(data))
    assert "\n" not in str(e.value)


def test_a_missing_model_directory_is_refused(data, tmp_path):
    cfg = _cfg(data, f"train.init_from={json.dumps(str(tmp_path / 'none'))}")
    with pytest.raises(ValueError, match="none: no such model directory"):
        load_warm_start(cfg, Dataset(data))
