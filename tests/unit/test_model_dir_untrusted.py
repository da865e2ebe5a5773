"""A model directory from elsewhere (issue 29): loading it never runs code it names, never reads
outside it, checks every model.json field in one line, and refuses NaN weights; a user's own
model loads only from the builder its caller names. Run: pytest -q
tests/unit/test_model_dir_untrusted.py"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

import recsync
from recsync.cli import main
from recsync.config import ConfigError, load_config
from recsync.data.reader import Chunk, Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.model.loss import logits
from recsync.model_dir import ModelDirError, write_model_dir
from recsync.model_dir.export import export_model
from recsync.model_dir.state import local_state
from recsync.model_dir.trained import load_model
from recsync.run.local_run import build_local_model, train_step
from recsync.run.warm_start import load_warm_start

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_model.py"
SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         "train.batch_size=64", "output.progress=false", "output.plot=false"]
# code shipped beside model.json: it would leave a marker if it ever ran
EVIL = ("from pathlib import Path\n"
        "Path(__file__).resolve().parents[1].joinpath('PWNED').write_text('import')\n"
        "def build(inputs, **kw):\n"
        "    Path(__file__).resolve().parents[1].joinpath('PWNED').write_text('build')\n")


def config(data, *extra):
    return load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, *extra])


def make_data(root: Path) -> Path:
    generate(root, rows=1024, eval_rows=256, spec=SynthSpec(seed=1, max_table_rows=50),
             processes=1, progress=False)
    return root


def write_trained(data: Path, out: Path, *extra: str):
    """A local model trained 3 steps and written (with optimizer state) as ``out/model``."""
    cfg = config(data, "output.save_optimizer_state=true", *extra)
    ds = Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    for batch in ds.batches(Chunk("train", 0, 0, 192), 64):
        train_step(model, batch)
    state = local_state(model, with_optimizer=True)
    info = write_model_dir(out, cfg, ds, state.tables, state.dense_state, state.trained,
                           dense_optimizer=state.dense_optimizer, state_dim=state.state_dim)
    return model, Path(info["path"])


def edit(model_dir: Path, change) -> Path:
    """Apply ``change`` to model.json's content (a dict) in place."""
    meta = json.loads((model_dir / "model.json").read_text())
    change(meta)
    (model_dir / "model.json").write_text(json.dumps(meta))
    return model_dir


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and all(c.isprintable() for c in msg), repr(msg)
    return msg


def eval_batch(data: Path):
    return next(Dataset(data).batches(Chunk("eval", 0, 0, 256), 256))


def own_scores(model, batch) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(logits(model.dense, batch, model.lookup.pull(batch).embeddings())
                             ).numpy()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    return write_trained(data, tmp_path_factory.mktemp("out"))[1]


@pytest.fixture
def copy(trained, tmp_path):
    return Path(shutil.copytree(trained, tmp_path / "model"))


# Finding 1: a model directory names code, and loading it used to run that code.

ATTACKS = [("pydoc:pipepager", {"cmd": "id > PWNED"}), ("os:system", {"command": "id > PWNED"}),
           ("this:x", {}), ("code/evil.py:build", {}), ("code.evil:build", {})]


@pytest.mark.parametrize("name, params", ATTACKS)
def test_loading_a_directory_that_names_code_runs_none_of_it(copy, monkeypatch, name, params):
    (copy / "code").mkdir()
    (copy / "code" / "evil.py").write_text(EVIL)
    (copy / "code" / "__init__.py").write_text("")
    edit(copy, lambda m: m["model"].update(name=name, params=params))
    monkeypatch.chdir(copy)  # where the shipped file and a relative PWNED would be
    monkeypatch.syspath_prepend(str(copy))  # even where code/ is importable
    had_this = "this" in sys.modules
    for load in (load_model, recsync.load_model):
        with pytest.raises(ModelDirError) as e:
            load(copy)
        assert one_line(e.value) == (
            f"{copy / 'model.json'}: model.name = {name!r} is a user's model; loading it runs "
            f"that code, so a model directory alone never does: if you know and trust the "
            f"model's code, name its builder yourself (builder= in Python, --builder on the "
            f"command line)")
    assert not (copy / "PWNED").exists()
    assert had_this or "this" not in sys.modules
    assert "code.evil" not in sys.modules


@pytest.mark.parametrize("command", [["predict", "DATA", "--out", "p.parquet"],
                                     ["export", "--out", "m.pt"]])
def test_predict_and_export_of_such_a_directory_run_nothing(copy, data, tmp_path, monkeypatch,
                                                            command):
    edit(copy, lambda m: m["model"].update(name="pydoc:pipepager", params={"cmd": "id > PWNED"}))
    monkeypatch.chdir(copy)
    args = [command[0], "--model", str(copy), *command[1:-1], str(tmp_path / command[-1])]
    args = [str(data) if a == "DATA" else a for a in args]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0 and "is a user's model; loading it runs that code" in \
        result.output, result.output
    assert not (copy / "PWNED").exists()


def test_init_from_builds_the_runs_own_model_never_the_directorys(copy, data, monkeypatch):
    edit(copy, lambda m: m["model"].update(name="pydoc:pipepager", params={"cmd": "id > PWNED"}))
    monkeypatch.chdir(copy)
    cfg = config(data, f"train.init_from={json.dumps(str(copy))}")
    with pytest.raises(ValueError, match=r"model\.name is \"pydoc:pipepager\" in the model, "
                                         r"\"dlrm\" in this run") as e:
        load_warm_start(cfg, Dataset(data))
    one_line(e.value)
    assert not (copy / "PWNED").exists()


def test_init_from_refuses_dense_optimizer_state_of_another_shape(copy, data):
    shutil.copyfile(copy / "table-000.safetensors", copy / "dense_optimizer.safetensors")
    cfg = config(data, f"train.init_from={json.dumps(str(copy))}")
    with pytest.raises(ValueError, match=r"the dense optimizer's state 'ids' is \[\d+\], this "
                                         r"run's \d+ dense parameters need") as e:
        load_warm_start(cfg, Dataset(data))
    one_line(e.value)


def test_a_builder_for_a_built_in_model_is_refused(copy):
    with pytest.raises(ModelDirError, match=r"model\.name = 'dlrm' is a built-in model, which "
                                            r"recsync rebuilds itself: give no builder") as e:
        load_model(copy, builder=f"{EXAMPLE}:build")
    one_line(e.value)


@pytest.fixture(scope="module")
def user_trained(data, tmp_path_factory):
    """examples/user_model.py trained (it still trains) and written as a model directory."""
    return write_trained(data, tmp_path_factory.mktemp("user"),
                         f'model.name="{EXAMPLE}:build"', "model.params.hidden=8")


def test_a_users_model_loads_with_the_builder_its_caller_names(user_trained, data):
    model, path = user_trained
    with pytest.raises(ModelDirError, match=r"is a user's model; .*name its builder "
                                            r"yourself") as e:
        recsync.load_model(path)
    one_line(e.value)
    loaded = recsync.load_model(path, builder=f"{EXAMPLE}:build")
    batch = eval_batch(data)
    assert loaded.dense.mlp[0].in_features == 13 + 4 and loaded.dense.mlp[0].out_features == 8
    assert np.array_equal(loaded.score_batch(batch), own_scores(model, batch))


def test_the_callers_builder_is_used_never_the_one_model_json_names(user_trained, data,
                                                                    tmp_path, monkeypatch):
    model, path = user_trained
    copied = Path(shutil.copytree(path, tmp_path / "model"))
    (copied / "code").mkdir()
    (copied / "code" / "evil.py").write_text(EVIL)
    edit(copied, lambda m: m["model"].update(name="code/evil.py:build"))
    monkeypatch.chdir(copied)
    loaded = load_model(copied, builder=f"{EXAMPLE}:build")
    batch = eval_batch(data)
    assert np.array_equal(loaded.score_batch(batch), own_scores(model, batch))
    assert not (copied / "PWNED").exists()


# Finding 4: symlinks out of the directory; crafted fields; absurd sizes.

@pytest.mark.parametrize("member", ["model.json", "dense.safetensors", "table-000.safetensors",
                                    "dense_optimizer.safetensors"])
def test_a_symlink_out_of_the_directory_is_not_followed(copy, tmp_path, member):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(copy / member, outside / member)  # intact: following it would load fine
    (copy / member).symlink_to(outside / member)
    with pytest.raises(ModelDirError, match=rf"{member}.* leads outside") as e:
        load_model(copy)
    one_line(e.value)


def test_a_symlink_inside_the_directory_is_fine(copy):
    (copy / "table-000.safetensors").rename(copy / "rows-of-c1")
    (copy / "table-000.safetensors").symlink_to("rows-of-c1")
    load_model(copy)


def _set(path: str, value):
    """A model.json change: ``path`` is dotted, list indices as numbers."""
    def change(meta):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = meta
        for p in parents:
            node = node[p]
        node[last] = value
    return change


@pytest.mark.parametrize("key, value, message", [
    ("dense", 5, r"model\.json: dense must be an object, got 5$"),
    ("train", {}, r"train\.seed must be an integer in \[0, 9223372036854775807\], got None"),
    ("train.embedding_init_scale", float("nan"), r"train\.embedding_init_scale must be a number"),
    ("dense_optimizer.param_groups", 5, r"dense_optimizer\.param_groups must be a list of "),
    ("dense_optimizer.scalars", {"step": "x"}, r"dense_optimizer\.scalars must map names to "),
    ("dense_optimizer.param_groups.0.updates", -1, r"param_groups\[0\]\.updates must be an "),
    ("model.bottom_mlp", [2**40], r"model\.bottom_mlp\.0: Input should be less than or equal "
                                  r"to 65536 \(got 1099511627776\)"),
    ("model.name", "x\n\x1b[31m", r"model\.name must be a name of at most 200 printable "
                                  r"characters, got 'x\\n\\x1b\[31m'"),
    ("model.unknown", 1, r"model\.unknown: Extra inputs are not permitted"),
    ("tables.0.rows", "50", r"tables\[0\]\.rows must be an integer in \[1, 1099511627776\]"),
    ("tables.0.dim", -1, r"tables\[0\]\.dim must be an integer in \[1, 65536\]"),
    ("tables.0.trained_rows", 2**63, r"tables\[0\]\.trained_rows must be an integer in"),
    ("tables.1.file", "table-000.safetensors", r"and dense\.file must name different files"),
    ("tables.0.file", "/etc/passwd", r"tables\[0\]\.file /etc/passwd is not a plain relative"),
    ("dense.file", "../model/dense.safetensors", r"dense\.file \.\./model/dense\.safetensors "
                                                 r"is not a plain relative name"),
    ("data.features", 5, r"model\.json: data: features must list the sparse features"),
    ("data.base_rate", 7, r"data\.base_rate must be null or a number in \[0, 1\], got 7"),
    ("data.preprocessing", "x", r"data: preprocessing must be null or an object, got 'x'"),
    ("data.preprocessing", {"hash": "h", "schema": {}, "standardize": {"d0": [1]}},
     r"data: preprocessing\.standardize\.'d0' must be \{\"mean\": m, \"std\": s > 0\}"),
    ("data.source", "s", r"data: source must be null or an object, got 's'"),
])
def test_crafted_fields_fail_in_one_line_naming_the_key(copy, key, value, message):
    edit(copy, _set(key, value))
    with pytest.raises(ModelDirError, match=message) as e:
        load_model(copy)
    assert one_line(e.value).startswith(f"{copy / 'model.json'}: ")


def test_a_model_larger_than_its_files_is_refused_before_it_is_allocated(copy):
    # three layers of 65536 x 65536 float32 would be 48 GiB: built on the meta device only
    edit(copy, _set("model.bottom_mlp", [65_536] * 3))
    begin = time.perf_counter()
    with pytest.raises(ModelDirError, match=r"dense\.safetensors: does not fit the model "
                                            r"model\.json describes: tensor 'bottom\.0\.bias' "
                                            r"is \(8,\) in the file, \(65536,\) in the model"):
        load_model(copy)
    assert time.perf_counter() - begin < 5


def test_an_override_of_an_absurd_width_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.bottom_mlp\.0: Input should be less than or "
                                          r"equal to 65536 \(got 1000000000000\)"):
        load_config(None, ["model.bottom_mlp=[1000000000000]"])


def test_tables_of_2_40_rows_load_with_their_trained_rows_only(copy, trained, data, tmp_path):
    def grow(meta):
        meta["model"]["table_rows"] = 2**40
        meta["data"]["id_dtype"] = "int64"
        for t in meta["tables"]:
            t["rows"] = 2**40
    edit(copy, grow)
    begin = time.perf_counter()
    big, small = load_model(copy), load_model(trained)
    assert time.perf_counter() - begin < 5 and big.specs[0].rows == 2**40
    batch = eval_batch(data)  # the rows an id has do not depend on the table's size
    assert np.array_equal(big.score_batch(batch), small.score_batch(batch))
    with pytest.raises(ValueError, match="max-bytes"):  # materialising is export's, checked
        export_model(copy, tmp_path / "m.pt")


# Finding 7 (part): a model trained into NaN.

@pytest.mark.parametrize("member, tensor, value", [
    ("dense.safetensors", "bottom.0.weight", float("nan")),
    ("table-003.safetensors", "rows", float("inf")),
    ("table-003.safetensors", "state", float("nan")),
    ("dense_optimizer.safetensors", None, float("nan")),
])
def test_nan_or_infinite_weights_are_refused_naming_the_file_and_tensor(copy, member, tensor,
                                                                        value):
    tensors = load_file(str(copy / member))
    tensor = tensor or sorted(tensors)[0]
    tensors[tensor].view(-1)[0] = value
    save_file(tensors, str(copy / member))
    with pytest.raises(ModelDirError, match=rf"{member}: tensor '{tensor}' holds NaN or "
                                            r"infinite values") as e:
        load_model(copy)
    one_line(e.value)


def test_a_fifo_named_by_model_json_is_refused_without_blocking(copy):
    os.unlink(copy / "table-002.safetensors")
    os.mkfifo(copy / "table-002.safetensors")
    with pytest.raises(ModelDirError, match=r"tables\[2\]\.file .* is not a regular file"):
        load_model(copy)


def test_a_data_sets_crafted_preprocessing_is_one_line_naming_its_meta_json(data, tmp_path):
    from recsync.data.format import DataFormatError
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["preprocessing"] = "x"  # predict and raw-row scoring read its fields
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=r"meta\.json: preprocessing must be null or an "
                                              r"object, got 'x'") as e:
        Dataset(copy)
    assert "\n" not in str(e.value)
