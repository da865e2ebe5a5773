"""How training steps run the dense model (recsync/model/compute.py): train.dense_precision and
train.compile, without Ray. Run: pytest -q tests/unit/test_dense_precision.py"""

from __future__ import annotations

import copy
import logging
import pickle

import pytest
import torch

from recsync.config import ConfigError, ModelConfig, TrainConfig, load_config
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.evaluate import evaluate
from recsync.model import compute
from recsync.model import loss as model_loss
from recsync.model.compute import compute_of, first_batch, prepare, resolve_precision, warm_up
from recsync.run.local_run import build_local_model, train_step

MODEL = ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8, 4])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_precision")
    generate(root, rows=512, eval_rows=128, spec=SynthSpec(seed=4, max_table_rows=40),
             processes=1, progress=False)
    return Dataset(root)


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU with native bfloat16, whatever this one has (autocast runs either way)."""
    monkeypatch.setattr(compute, "cpu_has_bf16", lambda: True)


@pytest.fixture
def no_bf16_cpu(monkeypatch):
    monkeypatch.setattr(compute, "cpu_has_bf16", lambda: False)


def _model(ds, **train):
    return build_local_model(MODEL, TrainConfig(seed=1, **train), ds)


def _linear_dtypes(module: torch.nn.Module) -> list[torch.dtype]:
    """Records the output dtype of every Linear layer of ``module`` on each call."""
    seen: list[torch.dtype] = []
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    return seen


# -- the config ----------------------------------------------------------------------------------

def test_an_unknown_precision_is_refused_naming_the_field_and_the_choices():
    with pytest.raises(ConfigError, match="dense_precision") as e:
        load_config(None, ['train.dense_precision="float16"'])
    assert "bfloat16" in str(e.value)


def test_the_defaults_are_auto_precision_and_no_compile():
    t = TrainConfig()
    assert (t.dense_precision, t.compile) == ("auto", False)


@pytest.mark.parametrize("setting, native, used, warns", [
    ("float32", True, "float32", False),
    ("auto", True, "bfloat16", False),
    ("auto", False, "float32", False),
    ("bfloat16", True, "bfloat16", False),
    ("bfloat16", False, "float32", True),
])
def test_the_precision_used_follows_the_setting_and_the_cpu(monkeypatch, setting, native, used,
                                                             warns):
    monkeypatch.setattr(compute, "cpu_has_bf16", lambda: native)
    got, warning = resolve_precision(setting, torch.device("cpu"))
    assert got == used
    assert (warning is not None) == warns
    if warns:
        assert "train.dense_precision" in warning and "float32" in warning


# -- bfloat16 ------------------------------------------------------------------------------------

def test_bf16_runs_the_mlps_in_bf16_and_keeps_rows_grads_params_and_loss_float32(tiny, bf16_cpu):
    m = _model(tiny, dense_precision="bfloat16")
    assert compute_of(m.dense).precision == "bfloat16"
    seen = _linear_dtypes(m.dense)
    pushed = []
    push = m.lookup.push
    m.lookup.push = lambda pulled: (pushed.append(pulled), push(pulled))[1]
    batch = first_batch(tiny, 64)
    out = model_loss.loss(m.dense, batch, m.lookup.pull(batch).embeddings())
    assert out.dtype == torch.float32  # the loss is computed from float32 logits
    assert seen and set(seen) == {torch.bfloat16}
    train_step(m, batch)
    grads = pushed[0].row_grads()
    assert grads and all(g.dtype == torch.float32 for g in grads)  # what goes to the PS
    assert all(leaf.dtype == torch.float32 for leaf in pushed[0].leaves)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in m.dense.parameters())
    state = [v for s in m.dense_optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert state and all(v.dtype == torch.float32 for v in state)


def test_evaluation_runs_float32_whatever_the_training_precision(tiny, bf16_cpu):
    m = _model(tiny, dense_precision="bfloat16")
    seen = _linear_dtypes(m.dense)
    evaluate(m.dense, m.lookup, tiny, 128, 64)
    assert seen and set(seen) == {torch.float32}


def test_float32_runs_no_autocast(tiny, bf16_cpu):
    m = _model(tiny, dense_precision="float32")
    seen = _linear_dtypes(m.dense)
    train_step(m, first_batch(tiny, 64))
    assert set(seen) == {torch.float32}


def test_bf16_on_a_cpu_without_it_falls_back_to_float32_with_a_logged_warning(
        tiny, no_bf16_cpu, caplog):
    with caplog.at_level(logging.WARNING, logger="recsync.model.compute"):
        m = _model(tiny, dense_precision="bfloat16")
    assert compute_of(m.dense).precision == "float32"
    assert any("no native bfloat16" in r.getMessage() for r in caplog.records)
    seen = _linear_dtypes(m.dense)
    train_step(m, first_batch(tiny, 64))
    assert set(seen) == {torch.float32}


def test_bf16_training_learns_about_as_float32_does(tiny, bf16_cpu):
    """Not a quality claim (scenario dense measures that): the same steps give close losses."""
    losses = {}
    for precision in ("float32", "bfloat16"):
        m = _model(tiny, dense_precision=precision)
        losses[precision] = [train_step(m, b) for c in tiny.chunks("train", 512)
                             for b in tiny.batches(c, 64)]
    assert losses["bfloat16"] == pytest.approx(losses["float32"], abs=0.02)


# -- compile -------------------------------------------------------------------------------------

class _Compiled(torch.nn.Module):
    """Stands in for torch.compile's wrapper (compiling takes seconds): counts its calls."""

    def __init__(self, module):
        super().__init__()
        self.module, self.calls = module, 0

    def forward(self, *args):
        self.calls += 1
        return self.module(*args)


@pytest.fixture
def fake_compile(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda module: _Compiled(module))


def test_compile_wraps_the_module_and_training_calls_the_wrapper(tiny, fake_compile):
    m = _model(tiny, compile=True)
    keys = list(m.dense.state_dict())
    wrapper = compute_of(m.dense).forward
    assert isinstance(wrapper, _Compiled) and wrapper.module is m.dense
    assert list(m.dense.state_dict()) == keys  # not a submodule: checkpoints unchanged
    train_step(m, first_batch(tiny, 64))
    assert wrapper.calls == 1
    evaluate(m.dense, m.lookup, tiny, 128, 64)  # evaluation calls the plain module
    assert wrapper.calls == 1


def test_warm_up_compiles_before_training_and_changes_no_parameter(tiny, fake_compile):
    m = _model(tiny, compile=True)
    before = [p.detach().clone() for p in m.dense.parameters()]
    took = warm_up(m.dense, m.lookup.plan, tiny, 64)
    assert took >= 0 and compute_of(m.dense).forward.calls == 1
    assert all(p.grad is None for p in m.dense.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, m.dense.parameters()))
    assert all(float(s["step"]) == 0 for s in m.dense_optimizer.state.values())  # no step


def test_warm_up_does_nothing_without_compile(tiny):
    m = _model(tiny, compile=False)
    assert warm_up(m.dense, m.lookup.plan, tiny, 64) == 0.0


def test_a_copied_or_pickled_module_keeps_the_precision_not_the_compiled_forward(
        tiny, fake_compile, bf16_cpu):
    m = _model(tiny, dense_precision="bfloat16", compile=True)
    for twin in (copy.deepcopy(m.dense), pickle.loads(pickle.dumps(m.dense))):
        assert compute_of(twin).precision == "bfloat16" and compute_of(twin).forward is None


def test_an_unprepared_module_trains_float32_eager():
    module = torch.nn.Linear(2, 1)
    assert compute_of(module).precision == "float32" and compute_of(module).forward is None
    assert prepare(module).precision == "float32"
