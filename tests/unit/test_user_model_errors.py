"""A user's model that breaks the contract (issue 29, finding 8): a builder that raises, returns
the wrong thing or exits at import, a forward that is not logits [B]. Each is one line naming
model.name and what the contract expects, in training and when a model directory loads, and
never ends the process. Run: pytest -q tests/unit/test_user_model_errors.py"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from recsync.config import ModelConfig, load_config
from recsync.data.reader import Chunk, Dataset
from recsync.model.inputs import DataTable, ModelInputs, SparseFeature
from recsync.model.loss import ModelContractError
from recsync.model.registry import build_model
from recsync.model_dir.trained import load_model
from recsync.run.local_run import build_local_model, train_step
from test_model_dir_untrusted import make_data, write_trained

USER = '''
import torch
from recsync.model.inputs import concat, feature_tables


class Linear(torch.nn.Module):
    def __init__(self, num_dense, wide=False, ints=False):
        super().__init__()
        self.linear = torch.nn.Linear(num_dense, 1)
        self.wide, self.ints = wide, ints

    def forward(self, dense, embeddings):
        out = self.linear(dense) + concat(embeddings).sum(1, keepdim=True)
        if self.ints:
            return (out.squeeze(1) > 0).long()
        return out if self.wide else out.squeeze(1)


def good(inputs):
    return Linear(inputs.num_dense)

def raises(inputs):
    raise RuntimeError("boom\\nsecond line")

def exits(inputs):
    raise SystemExit(4)

def tables_of_int(inputs):
    return Linear(inputs.num_dense), 5

def three(inputs):
    return Linear(inputs.num_dense), feature_tables(inputs), None

def wide(inputs):
    return Linear(inputs.num_dense, wide=True)

def ints(inputs):
    return Linear(inputs.num_dense, ints=True)
'''
CONTRACT = ("a builder is called as builder(inputs, **model.params) and returns a "
            "torch.nn.Module, or (module, tables) with tables a list of TableSpec")
INPUTS = ModelInputs(dense=("a", "b"), features=(SparseFeature("s", "t"),),
                     tables=(DataTable("t", 10),), embedding_dim=3)


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    (tmp_path / "usermod.py").write_text(USER)
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and all(c.isprintable() for c in msg), repr(msg)
    return msg


@pytest.mark.parametrize("builder, message", [
    ("raises", r"model\.name = 'usermod\.py:raises': the builder raised RuntimeError: "
               r"boom\\nsecond line; "),
    ("exits", r"model\.name = 'usermod\.py:exits': the builder raised SystemExit: 4; "),
    ("tables_of_int", r"model\.name = 'usermod\.py:tables_of_int': the builder returned "
                      r"\(module, int\); "),
    ("three", r"model\.name = 'usermod\.py:three': the builder returned a tuple of 3; "),
])
def test_a_builder_that_breaks_the_contract_is_one_line_naming_it(user_file, builder, message):
    with pytest.raises(ValueError, match=message) as e:
        build_model(ModelConfig(name=f"usermod.py:{builder}"), INPUTS)
    assert CONTRACT in one_line(e.value)


def test_sys_exit_at_import_is_a_value_error_not_the_end_of_the_process(user_file):
    with pytest.raises(ValueError, match=r"model\.name = 'exits_at_import\.py:build': cannot "
                                         r"import 'exits_at_import\.py' \(SystemExit: 3\)") as e:
        build_model(ModelConfig(name="exits_at_import.py:build"), INPUTS)
    one_line(e.value)
    model, tables = build_model(ModelConfig(name="usermod.py:good"), INPUTS)  # still here
    assert isinstance(model, torch.nn.Module) and [t.name for t in tables] == ["t"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("builder, got", [("wide", r"a torch\.float32 tensor of shape \[64, 1\]"),
                                          ("ints", r"a torch\.int64 tensor of shape \[64\]")])
def test_training_a_forward_that_is_not_logits_b_names_the_model(user_file, data, builder, got):
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", "train.batch_size=64",
                             f'model.name="usermod.py:{builder}"'])
    ds = Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    batch = next(ds.batches(Chunk("train", 0, 0, 64), 64))
    with pytest.raises(ModelContractError, match=rf"model\.name = 'usermod\.py:{builder}': "
                                                 rf"forward\("
                                         rf"dense, embeddings\) returned {got}; the contract is "
                                         rf"floating-point logits of shape \[B\] = \[64\]") as e:
        train_step(model, batch)
    one_line(e.value)


def test_loading_with_a_builder_that_fails_is_one_line(user_file, data, tmp_path):
    _, path = write_trained(data, tmp_path / "out", 'model.name="usermod.py:good"')
    assert load_model(path, builder="usermod.py:good").dense.linear.in_features == 13
    for builder, message in [("exits_at_import.py:build", r"cannot import 'exits_at_import\.py' "
                                                          r"\(SystemExit: 3\)"),
                             ("usermod.py:raises", "the builder raised RuntimeError"),
                             ("usermod.py:three", "the builder returned a tuple of 3"),
                             ("usermod.py:nothing", "has no callable 'nothing'")]:
        with pytest.raises(ValueError, match=rf"model\.json: cannot rebuild the model \(builder "
                                             rf"'{builder}': .*{message}") as e:
            load_model(path, builder=builder)
        one_line(e.value)
    moved = Path(shutil.copytree(path, tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="a torch.int64 tensor of shape"):
        load_model(moved, builder="usermod.py:ints")(torch.zeros(5, 13),
                                                    torch.zeros(5, 26, dtype=torch.int64))
