"""DLRM and logistic regression: shapes, interaction features, gradients, the registry."""

from __future__ import annotations

import pytest
import torch

from recsync.config import ModelConfig
from recsync.model.dlrm import DLRM, LogisticRegression
from recsync.model.inputs import DataTable, ModelInputs, SparseFeature
from recsync.model.registry import MODELS, build_model

B, T, DIM, DENSE = 5, 6, 4, 13


def inputs(dim=DIM, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(B, DENSE, generator=g)
    embs = [torch.randn(B, dim, generator=g).requires_grad_(requires_grad) for _ in range(T)]
    return dense, embs


def dlrm(bottom=(8,), top=(8, 4)):
    torch.manual_seed(0)
    return DLRM(DENSE, T, DIM, list(bottom), list(top))


def test_dlrm_output_shape():
    m = dlrm()
    out = m(*inputs())
    assert out.shape == (B,) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_embeddings_as_one_tensor_or_a_list():
    dense, embs = inputs()
    m = dlrm()
    assert torch.equal(m(dense, torch.stack(embs, dim=1)), m(dense, embs))
    torch.manual_seed(0)
    lr = LogisticRegression(DENSE)
    dense, embs = inputs(dim=1)
    assert torch.allclose(lr(dense, torch.stack(embs, dim=1)), lr(dense, embs))


def test_dlrm_interaction_features():
    m = dlrm(bottom=(8,), top=(3,))
    pairs = (T + 1) * T // 2
    assert m.top[0].in_features == pairs + DIM
    assert len(m.tri_rows) == pairs
    # bottom MLP ends at the embedding width, with a ReLU (as in DLRM)
    assert m.bottom[-2].out_features == DIM and isinstance(m.bottom[-1], torch.nn.ReLU)
    # top MLP ends with one logit and no activation
    assert m.top[-1].out_features == 1 and isinstance(m.top[-1], torch.nn.Linear)
    # the top MLP's input is [x, every pairwise dot product of (x, e_1 .. e_T)], each pair once
    seen = {}
    m.top.register_forward_hook(lambda mod, args, out: seen.setdefault("in", args[0]))
    dense, embs = inputs()
    m(dense, embs)
    x = m.bottom(dense)
    vectors = [x, *embs]
    expected = [(vectors[i] * vectors[j]).sum(1) for i in range(T + 1) for j in range(i)]
    got = seen["in"]
    assert torch.allclose(got[:, :DIM], x)
    assert torch.allclose(got[:, DIM:], torch.stack(expected, 1), atol=1e-5)


def test_dlrm_gradient_flows_to_every_embedding_and_parameter():
    m = dlrm()
    dense, embs = inputs(requires_grad=True)
    m(dense, embs).sum().backward()
    for e in embs:
        assert e.grad is not None and e.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None, name



def effect_of_table0_given_table1(m, dense, embs, alt):
    """How much switching table 0's rows (embs -> alt) moves the logit, with table 1 at its
    first and at its alternative rows: equal for an additive model, unequal with interactions."""
    def f(a, b):
        e = list(embs)
        e[0], e[1] = a, b
        return m(dense, e)

    return f(embs[0], embs[1]) - f(alt[0], embs[1]), f(embs[0], alt[1]) - f(alt[0], alt[1])

def test_dlrm_interacts_embeddings():
    """Changing one table's embedding shifts the logit by an amount that depends on the others."""
    m = dlrm()
    dense, embs = inputs()
    diff_b, diff_b2 = effect_of_table0_given_table1(m, dense, embs, inputs(seed=1)[1])
    assert not torch.allclose(diff_b, diff_b2, atol=1e-4)


def test_logistic_regression_is_additive():
    torch.manual_seed(0)
    m = LogisticRegression(DENSE)
    dense, embs = inputs(dim=1)
    alt = inputs(dim=1, seed=1)[1]
    diff_b, diff_b2 = effect_of_table0_given_table1(m, dense, embs, alt)
    assert torch.allclose(diff_b, diff_b2, atol=1e-6)
    assert torch.allclose(diff_b, (embs[0] - alt[0]).squeeze(1), atol=1e-6)
    # logit = w·dense + b + Σ_t e_t
    expected = m.linear(dense).squeeze(1) + torch.cat(embs, 1).sum(1)
    assert torch.allclose(m(dense, embs), expected)
    assert m(dense, embs).shape == (B,)


def test_build_model():
    names, rows = [f"C{i}" for i in range(T)], [10 * (i + 1) for i in range(T)]
    cfg = ModelConfig(embedding_dim=3, bottom_mlp=[5], top_mlp=[4])
    model_inputs = ModelInputs(dense=tuple(f"I{i}" for i in range(DENSE)),
                               features=tuple(SparseFeature(n, n) for n in names),
                               tables=tuple(DataTable(n, r) for n, r in zip(names, rows)))
    model, tables = build_model(cfg, model_inputs)
    assert isinstance(model, DLRM)
    assert [(t.name, t.rows, t.dim) for t in tables] == [(n, r, 3) for n, r in zip(names, rows)]
    dense, _ = inputs()
    assert model(dense, [torch.zeros(B, 3)] * T).shape == (B,)

    model, tables = build_model(ModelConfig(name="lr", embedding_dim=3), model_inputs)
    assert isinstance(model, LogisticRegression)
    assert all(t.dim == 1 for t in tables)


def test_build_model_unknown_name():
    with pytest.raises(ValueError) as e:
        build_model(ModelConfig(name="no_such_model"), ModelInputs(
            dense=(), features=(SparseFeature("C1", "C1"),), tables=(DataTable("C1", 10),)))
    msg = str(e.value)
    assert "model.name" in msg and "'no_such_model'" in msg
    for name in MODELS:
        assert name in msg
