"""The model directory (recsync/model_dir): what a run writes as OUT/model, read back without
unpickling, loaded as a module whose scores are the trained model's, scored by `recsync
predict`, exported to a file that scores without recsync. Run: pytest -q
tests/unit/test_model_dir.py"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import recsync
from recsync.cli import main
from recsync.config import load_config
from recsync.data.reader import Chunk, Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.core import auc_logloss
from recsync.model.loss import logits
from recsync.model_dir import ModelDirError, read_model_dir, write_model_dir
from recsync.model_dir.export import export_model
from recsync.model_dir.state import local_state
from recsync.run.driver import run
from recsync.run.local_run import build_local_model, train_step
from test_multi_hot import make_dataset

SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         "train.batch_size=64", "output.progress=false", "output.plot=false"]


def config(data, *extra):
    return load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, *extra])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=1024, eval_rows=256, spec=SynthSpec(seed=1, max_table_rows=50),
             processes=1, progress=False)
    return root


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A local model trained 6 steps, its model directory (with optimizer state) and data."""
    cfg = config(data, "output.save_optimizer_state=true")
    ds = Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    for batch in ds.batches(Chunk("train", 0, 0, 384), 64):
        train_step(model, batch)
    out = tmp_path_factory.mktemp("out")
    state = local_state(model, with_optimizer=True)
    info = write_model_dir(out, cfg, ds, state.tables, state.dense_state, state.trained,
                           dense_optimizer=state.dense_optimizer, state_dim=state.state_dim)
    return model, Path(info["path"]), ds, cfg


def own_scores(model, batch) -> np.ndarray:
    """The LocalModel's scores, through its own store."""
    with torch.no_grad():
        return torch.sigmoid(logits(model.dense, batch, model.lookup.pull(batch).embeddings())
                             ).numpy()


def test_the_directory_holds_the_touched_rows_dense_and_optimizer_state(trained):
    model, path, _, cfg = trained
    files = read_model_dir(path)
    store = model.lookup.store
    snap = store.snapshot()
    assert files.meta["format"] == "recsync-model" and files.meta["optimizer_state"]
    assert files.meta["train"]["seed"] == cfg.train.seed
    assert len(files.tables) == len(store.tables)
    for t, (ids, rows, state) in enumerate(files.tables):
        assert torch.equal(ids, torch.from_numpy(snap[f"t{t}.local"]))  # one shard: local = id
        assert torch.equal(rows, torch.from_numpy(snap[f"t{t}.weights"]))
        assert torch.equal(state, torch.from_numpy(snap[f"t{t}.state"]))
        assert files.meta["tables"][t]["trained_rows"] == len(ids) <= store.tables[t].rows
    assert sum(len(ids) for ids, _, _ in files.tables) < sum(t.rows for t in store.tables)
    for k, v in model.dense.state_dict().items():
        assert torch.equal(files.dense_state[k], v)
    opt = model.dense_optimizer.state_dict()["state"]
    flat = files.dense_optimizer_state["state"][0]["sum"]  # Adagrad's, parameters in order
    assert torch.equal(flat, torch.cat([opt[i]["sum"].reshape(-1) for i in sorted(opt)]))


def test_load_model_scores_what_the_trained_model_scores(trained):
    model, path, ds, _ = trained
    loaded = recsync.load_model(path)
    assert isinstance(loaded, torch.nn.Module)
    for batch in ds.batches(Chunk("eval", 0, 0, 256), 100):  # untouched rows included
        expected = own_scores(model, batch)
        assert np.array_equal(loaded.score_batch(batch), expected)
        assert np.array_equal(loaded(batch.dense, batch.sparse).numpy(), expected)


def test_a_run_writes_its_model_and_predict_gives_its_final_evaluation(data, tmp_path):
    summary = run(config(data), tmp_path / "run")
    model_info = summary["model"]
    assert model_info["path"] == str(tmp_path / "run" / "model") and model_info["write_s"] > 0
    assert model_info["bytes"] == sum(p.stat().st_size for p in (tmp_path / "run" /
                                                                 "model").iterdir())
    assert not read_model_dir(tmp_path / "run" / "model").meta["optimizer_state"]
    result = CliRunner().invoke(main, ["predict", "--model", str(tmp_path / "run" / "model"),
                                       str(data), "--out", str(tmp_path / "p.parquet")])
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "p.parquet")
    assert table.column_names == ["score", "label"] and table.num_rows == 256
    metrics = auc_logloss(table["label"].to_numpy(), table["score"].to_numpy())
    assert metrics["auc"] == summary["eval"]["auc"]
    assert metrics["logloss"] == pytest.approx(summary["eval"]["logloss"], abs=1e-7)


def test_predict_writes_csv_in_the_splits_order(trained, tmp_path):
    model, path, ds, _ = trained
    result = CliRunner().invoke(main, ["predict", "--model", str(path), str(ds.root),
                                       "--split", "train", "--batch-size", "100",
                                       "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 0, result.output
    table = pacsv.read_csv(tmp_path / "p.csv")
    batch = ds.read(Chunk("train", 0, 0, 1024))
    assert np.abs(table["score"].to_numpy() - own_scores(model, batch)).max() <= 1e-6
    assert np.array_equal(table["label"].to_numpy(), batch.label.numpy())


def test_predict_refuses_raw_rows_of_synthetic_data_and_odd_outputs(trained, tmp_path):
    _, path, ds, _ = trained
    raw = tmp_path / "rows.csv"
    raw.write_text("a,b\n1,2\n")
    runner = CliRunner()
    result = runner.invoke(main, ["predict", "--model", str(path), str(raw), "--out",
                                  str(tmp_path / "p.parquet")])
    assert result.exit_code == 2 and "raw rows cannot be scored for synthetic" in result.output
    result = runner.invoke(main, ["predict", "--model", str(path), str(ds.root), "--out",
                                  str(tmp_path / "p.json")])
    assert result.exit_code == 2 and ".parquet or .csv" in result.output
    assert not list(tmp_path.glob("*p.*"))


def test_a_completed_run_only_writes_model_and_a_failed_one_none(data, tmp_path, monkeypatch):
    summary = run(config(data, "output.save_model=false"), tmp_path / "off")
    assert summary["model"] is None and not (tmp_path / "off" / "model").exists()

    def fail(*args):
        raise RuntimeError("bad step")

    monkeypatch.setattr("recsync.run.local_run._train", fail)
    with pytest.raises(RuntimeError):
        run(config(data), tmp_path / "failed")
    assert sorted(p.name for p in (tmp_path / "failed").iterdir()) == [
        "config.toml", "metrics.jsonl", "summary.json"]


def test_a_write_that_fails_leaves_the_older_model_whole(trained, tmp_path, monkeypatch):
    model, _, ds, cfg = trained
    state = local_state(model, with_optimizer=False)
    args = (cfg, ds, state.tables, state.dense_state, state.trained)
    first = write_model_dir(tmp_path, *args)
    before = {p.name: p.read_bytes() for p in Path(first["path"]).iterdir()}
    calls = []

    def save_then_fail(tensors, filename):
        calls.append(filename)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        from safetensors.torch import save_file
        save_file(tensors, filename)

    monkeypatch.setattr("recsync.model_dir.write.save_file", save_then_fail)
    with pytest.raises(OSError):
        write_model_dir(tmp_path, *args)
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no directory half built
    assert {p.name: p.read_bytes() for p in Path(first["path"]).iterdir()} == before
    monkeypatch.undo()
    again = write_model_dir(tmp_path, *args)  # replaces it whole
    assert sorted(os.listdir(tmp_path)) == ["model"] and again["bytes"] == first["bytes"]


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_damaged_directories_fail_in_one_line_naming_the_file(trained, tmp_path):
    _, path, _, _ = trained
    broken = _copy(path, tmp_path / "m1")
    (broken / "table-003.safetensors").unlink()
    with pytest.raises(ModelDirError, match=r"table-003\.safetensors: missing"):
        read_model_dir(broken)
    broken = _copy(path, tmp_path / "m2")
    data = (broken / "dense.safetensors").read_bytes()
    (broken / "dense.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelDirError, match=r"dense\.safetensors: cannot be read"):
        read_model_dir(broken)
    broken = _copy(path, tmp_path / "m3")
    meta = json.loads((broken / "model.json").read_text())
    meta["tables"][0]["trained_rows"] += 1
    (broken / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ModelDirError, match=r"table-000\.safetensors: ids are .* model\.json "
                                            r"says int64"):
        read_model_dir(broken)
    meta["format_version"] = 99
    (broken / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ModelDirError, match="model.json: format_version 99 is not supported"):
        read_model_dir(broken)
    meta["format_version"], meta["tables"][0]["file"] = 1, "../../etc/passwd"
    (broken / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ModelDirError, match=r"tables\[0\]\.file \.\./\.\./etc/passwd is not a "
                                            r"plain relative name"):
        read_model_dir(broken)
    with pytest.raises(ModelDirError, match="model.json: missing") as e:
        read_model_dir(tmp_path)
    assert "\n" not in str(e.value)


NO_RECSYNC = """
import sys
sys.modules["recsync"] = None  # any import of recsync fails: the files must not need it
import torch
inputs, out, *files = sys.argv[1:]
args = torch.load(inputs)
models = [torch.jit.load(f) if f.endswith(".pt") else torch.export.load(f).module()
          for f in files]
torch.save([m(*args) for m in models], out)
"""


def score_elsewhere(files: list[Path], args: tuple, tmp_path: Path) -> list[torch.Tensor]:
    """Each file's scores of ``args`` in a fresh interpreter that cannot import recsync (``-I``:
    no PYTHONPATH, no current directory; recsync's editable install blocked)."""
    torch.save(args, tmp_path / "inputs.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-I", "-c", NO_RECSYNC, str(tmp_path / "inputs.pt"),
                           str(tmp_path / "scores.pt"), *map(str, files)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(tmp_path / "scores.pt")


def test_the_torchscript_file_scores_without_recsync(trained, tmp_path):
    model, path, ds, _ = trained
    result = CliRunner().invoke(main, ["export", "--model", str(path), "--out",
                                       str(tmp_path / "m.pt")])
    assert result.exit_code == 0, result.output
    batch = ds.read(Chunk("eval", 0, 0, 256))
    [scores] = score_elsewhere([tmp_path / "m.pt"], (batch.dense, batch.sparse), tmp_path)
    assert np.abs(scores.numpy() - own_scores(model, batch)).max() <= 1e-6


def test_multi_hot_models_export_and_score_alike(tmp_path):
    """Multi-hot sum and mean pooling, a shared table, tables of two dims (wide_deep); a batch
    of another size than the one traced; TorchScript and torch.export."""
    root, _ = make_dataset(tmp_path / "data")
    run(config(root, 'model.name="wide_deep"', "train.batch_size=16"), tmp_path / "run")
    loaded = recsync.load_model(tmp_path / "run" / "model")
    ds = Dataset(root)
    batch = ds.read(Chunk("eval", 0, 0, 20))
    args = (batch.dense, batch.sparse, *[t for pair in batch.multi for t in pair])
    expected = loaded.score_batch(batch)
    assert np.array_equal(loaded(*args).numpy(), expected)
    files = [tmp_path / "m.pt", tmp_path / "m.pt2"]
    for file, fmt in zip(files, ["torchscript", "torch-export"]):
        export_model(tmp_path / "run" / "model", file, fmt=fmt)
    for scores in score_elsewhere(files, args, tmp_path):
        assert np.abs(scores.numpy() - expected).max() <= 1e-6


def test_export_refuses_tables_over_the_limit_naming_the_largest(trained, tmp_path):
    _, path, _, _ = trained
    result = CliRunner().invoke(main, ["export", "--model", str(path), "--out",
                                       str(tmp_path / "m.pt"), "--max-bytes", "1000"])
    assert result.exit_code == 2
    assert "over --max-bytes 1,000 bytes; the largest is table C" in result.output
    assert not list(tmp_path.iterdir())
