"""The built-in models and user models behind the model contract (recsync/model/inputs.py):
building from ModelInputs, shapes, gradients, the output bias, each model's arithmetic against
a hand computation, user builders by name, and the errors a user sees."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from recsync.config import ModelConfig, load_config
from recsync.embedding.spec import TableSpec
from recsync.model.dcn import DCN, CrossNetwork
from recsync.model.deepfm import DeepFM, fm_second_order
from recsync.model.dlrm import DLRM
from recsync.model.inputs import (DataTable, FeatureEmbeddings, ModelInputs, SparseFeature,
                                  feature_tables, slot_dims)
from recsync.model.lr import LogisticRegression
from recsync.model.registry import MODELS, apply_table_rows, build_model
from recsync.model.wide_deep import WideDeep

B, DENSE, DIM = 5, 3, 4
BASE_RATE = 0.17
# single-hot features, two sharing table "site", one multi-hot (pooled) feature, a table no
# feature reads
INPUTS = ModelInputs(
    dense=tuple(f"I{i}" for i in range(DENSE)),
    features=(SparseFeature("site_id", "site"), SparseFeature("user", "user"),
              SparseFeature("ref_site", "site"), SparseFeature("tags", "tag", pooling="sum")),
    tables=(DataTable("site", 50), DataTable("user", 30), DataTable("tag", 20),
            DataTable("unused", 7)),
    embedding_dim=DIM, base_rate=BASE_RATE)
SLOTS = 4
SMALL = dict(embedding_dim=DIM, bottom_mlp=[8], top_mlp=[8, 4], deep_mlp=[8, 4], cross_layers=2)


def build(name, inputs=INPUTS, **kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, **{**SMALL, **kw}), inputs)


def embeddings_for(inputs, tables, seed=0, requires_grad=False):
    """One [B, dim] tensor per slot, as the lookup hands them (stacked when dims agree)."""
    g = torch.Generator().manual_seed(seed)
    dims = slot_dims(inputs, tables)
    slots = [torch.randn(B, d, generator=g).requires_grad_(requires_grad) for d in dims]
    stacked = torch.stack(slots, 1) if len(set(dims)) == 1 else None
    return FeatureEmbeddings(slots, stacked) if stacked is None else FeatureEmbeddings.of(
        stacked.detach().requires_grad_(requires_grad))


def dense_input(seed=0):
    return torch.randn(B, DENSE, generator=torch.Generator().manual_seed(seed))


# -- every built-in model -----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MODELS))
def test_builds_forwards_and_backpropagates(name):
    model, tables = build(name)
    assert all(isinstance(t, TableSpec) for t in tables)
    assert {t.source for t in tables} == {"site", "user", "tag"}  # "unused" gets no table
    embs = embeddings_for(INPUTS, tables, requires_grad=True)
    assert len(embs) == sum(1 for t in tables for f in INPUTS.features if f.table == t.source)
    out = model(dense_input(), embs)
    assert out.shape == (B,) and out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    leaves = [embs.stacked] if embs.stacked is not None else list(embs)
    for e in leaves:
        assert e.grad is not None and e.grad.abs().sum() > 0
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname


@pytest.mark.parametrize("name", sorted(MODELS))
def test_without_dense_features(name, recwarn):
    """Avazu has no dense columns: the models still build (no warnings) and train."""
    inputs = ModelInputs(**{**INPUTS.__dict__, "dense": ()})
    model, tables = build(name, inputs)
    embs = embeddings_for(inputs, tables, requires_grad=True)
    out = model(torch.zeros(B, 0), embs)
    assert out.shape == (B,)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.numel())
    assert not [w for w in recwarn if "zero-element" in str(w.message)]


def test_tables_of_each_model():
    dims = {name: [(t.name, t.rows, t.dim, t.source) for t in build(name)[1]]
            for name in MODELS}
    deep = [("site", 50, DIM, "site"), ("user", 30, DIM, "user"), ("tag", 20, DIM, "tag")]
    linear = [(n + ".linear", r, 1, s) for n, r, _, s in deep]
    assert dims["dlrm"] == dims["dcn"] == deep
    assert dims["deepfm"] == dims["wide_deep"] == deep + linear
    assert dims["lr"] == [(n, r, 1, s) for n, r, _, s in deep]


@pytest.mark.parametrize("name", ["dlrm", "dcn", "lr"])
def test_a_plain_stacked_tensor_is_accepted(name):
    model, tables = build(name)
    model.eval()
    embs = embeddings_for(INPUTS, tables)
    assert torch.allclose(model(dense_input(), embs.stacked), model(dense_input(), embs))
    assert torch.allclose(model(dense_input(), list(embs)), model(dense_input(), embs))


@pytest.mark.parametrize("name", ["deepfm", "wide_deep"])
def test_two_table_sets_refuse_one_tensor(name):
    model, tables = build(name)
    with pytest.raises(TypeError, match=name):
        model(dense_input(), torch.zeros(B, 2 * SLOTS, DIM))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_output_bias_starts_at_the_base_rate(name):
    model, tables = build(name)
    bias = {"dlrm": lambda m: m.top[-1].bias, "dcn": lambda m: m.deep[-1].bias,
            "lr": lambda m: m.linear.bias, "deepfm": lambda m: m.linear.bias,
            "wide_deep": lambda m: m.wide.bias}[name](model)
    assert bias.item() == pytest.approx(math.log(BASE_RATE / (1 - BASE_RATE)))
    # a sum of parts has one bias: the deep part's head has none
    if name in ("deepfm", "wide_deep"):
        assert model.deep[-1].bias is None
    # with every input 0, logistic regression predicts the base rate
    if name == "lr":
        zero = FeatureEmbeddings([torch.zeros(B, d) for d in slot_dims(INPUTS, tables)])
        p = torch.sigmoid(model(torch.zeros(B, DENSE), zero))
        assert torch.allclose(p, torch.full((B,), BASE_RATE))


@pytest.mark.parametrize("rate", [None, 0.0, 1.0])
def test_without_a_usable_base_rate_the_bias_keeps_torch_init(rate):
    inputs = ModelInputs(**{**INPUTS.__dict__, "base_rate": rate})
    a, _ = build("lr", inputs)
    b, _ = build("lr", ModelInputs(**{**INPUTS.__dict__, "base_rate": None}))
    assert torch.equal(a.linear.bias, b.linear.bias)


@pytest.mark.parametrize("name", ["dlrm", "dcn", "deepfm", "wide_deep"])
def test_dropout_after_every_hidden_layer(name):
    model, _ = build(name, dropout=0.3)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(d.p == 0.3 for d in drops)
    hidden = {"dlrm": 1 + 2, "dcn": 2, "deepfm": 2, "wide_deep": 2}[name]
    assert len(drops) == hidden, [type(m).__name__ for m in model.modules()]
    assert not [m for m in build(name)[0].modules() if isinstance(m, torch.nn.Dropout)]
    # eval mode: deterministic
    model.eval()
    embs = embeddings_for(INPUTS, build(name)[1])
    assert torch.equal(model(dense_input(), embs), model(dense_input(), embs))
    assert linears


# -- each model's arithmetic --------------------------------------------------------------------

def test_dlrm_interaction_over_slots():
    torch.manual_seed(0)
    m = DLRM(DENSE, SLOTS, DIM, [8], [3])
    pairs = (SLOTS + 1) * SLOTS // 2
    assert m.top[0].in_features == pairs + DIM
    assert m.bottom[-2].out_features == DIM and isinstance(m.bottom[-1], torch.nn.ReLU)
    assert m.top[-1].out_features == 1 and isinstance(m.top[-1], torch.nn.Linear)
    seen = {}
    m.top.register_forward_hook(lambda mod, args, out: seen.setdefault("in", args[0]))
    dense, embs = dense_input(), list(embeddings_for(INPUTS, feature_tables(INPUTS)))
    m(dense, embs)
    x = m.bottom(dense)
    vectors = [x, *embs]
    expected = [(vectors[i] * vectors[j]).sum(1) for i in range(SLOTS + 1) for j in range(i)]
    assert torch.allclose(seen["in"][:, :DIM], x)
    assert torch.allclose(seen["in"][:, DIM:], torch.stack(expected, 1), atol=1e-5)


def test_dcn_cross_layer_by_hand():
    torch.manual_seed(0)
    width = 6
    net = CrossNetwork(width, 2)
    x0 = torch.randn(B, width)
    x = x0
    for layer in net.layers:
        w, b = layer.weight, layer.bias
        x = torch.stack([x0[i] * (w @ x[i] + b) + x[i] for i in range(B)])
    assert torch.allclose(net(x0), x, atol=1e-6)
    # the model: cross over concat(dense, embeddings), then the deep MLP to one logit
    m = DCN(DENSE, SLOTS * DIM, 2, [8])
    embs = embeddings_for(INPUTS, feature_tables(INPUTS))
    x0 = torch.cat([dense_input(), *embs], dim=1)
    assert torch.allclose(m(dense_input(), embs), m.deep(m.cross(x0)).squeeze(1))


def test_fm_term_equals_the_pairwise_sum():
    e = torch.randn(B, 7, DIM)
    pairwise = sum((e[:, i] * e[:, j]).sum(1) for i in range(7) for j in range(i + 1, 7))
    assert torch.allclose(fm_second_order(e), pairwise, atol=1e-5)


def test_deepfm_is_first_order_plus_fm_plus_deep():
    model, tables = build("deepfm")
    assert isinstance(model, DeepFM)
    embs = embeddings_for(INPUTS, tables)
    deep, linear = list(embs[:SLOTS]), list(embs[SLOTS:])
    dense = dense_input()
    first = model.linear(dense).squeeze(1) + torch.cat(linear, 1).sum(1)
    pairwise = sum((deep[i] * deep[j]).sum(1) for i in range(SLOTS) for j in range(i))
    mlp = model.deep(torch.cat([dense, *deep], 1)).squeeze(1)
    assert torch.allclose(model(dense, embs), first + pairwise + mlp, atol=1e-5)


def test_wide_deep_is_wide_plus_deep():
    model, tables = build("wide_deep")
    assert isinstance(model, WideDeep)
    embs = embeddings_for(INPUTS, tables)
    dense = dense_input()
    wide = model.wide(dense).squeeze(1) + torch.cat(list(embs[SLOTS:]), 1).sum(1)
    deep = model.deep(torch.cat([dense, *embs[:SLOTS]], 1)).squeeze(1)
    assert torch.allclose(model(dense, embs), wide + deep, atol=1e-6)


def test_logistic_regression_is_additive():
    model, tables = build("lr")
    assert isinstance(model, LogisticRegression)
    embs = embeddings_for(INPUTS, tables)
    expected = model.linear(dense_input()).squeeze(1) + torch.cat(list(embs), 1).sum(1)
    assert torch.allclose(model(dense_input(), embs), expected, atol=1e-6)


def test_dlrm_interacts_embeddings():
    model, tables = build("dlrm")
    model.eval()
    e, alt = list(embeddings_for(INPUTS, tables)), list(embeddings_for(INPUTS, tables, seed=1))

    def f(a, b):
        return model(dense_input(), [a, b, *e[2:]])

    assert not torch.allclose(f(e[0], e[1]) - f(alt[0], e[1]), f(e[0], alt[1]) - f(alt[0], alt[1]),
                              atol=1e-4)


# -- table rows, dims ---------------------------------------------------------------------------

def test_apply_table_rows():
    assert apply_table_rows(ModelConfig(), INPUTS).tables == INPUTS.tables
    wide = apply_table_rows(ModelConfig(table_rows=100), INPUTS)
    assert [t.rows for t in wide.tables] == [100] * 4
    assert [t.rows for t in apply_table_rows(ModelConfig(table_rows=50), INPUTS).tables] == [50] * 4
    with pytest.raises(ValueError, match="model.table_rows = 49 .*site: 50 rows"):
        apply_table_rows(ModelConfig(table_rows=49), INPUTS)
    assert apply_table_rows(ModelConfig(embedding_dim=9), INPUTS).embedding_dim == 9
    _, tables = build_model(ModelConfig(table_rows=100, embedding_dim=9), INPUTS)
    assert [(t.rows, t.dim) for t in tables] == [(100, 9)] * 3


def test_dlrm_needs_two_vectors():
    one = ModelInputs(dense=(), features=(SparseFeature("a", "a"),), tables=(DataTable("a", 5),))
    with pytest.raises(ValueError, match="two vectors"):
        build("dlrm", one)


def test_schema_dims():
    mixed = ModelInputs(**{**INPUTS.__dict__, "tables": (DataTable("site", 50, dim=8),
                                                         *INPUTS.tables[1:])})
    for name in ("dlrm", "deepfm"):
        with pytest.raises(ValueError, match=f"model.name = \"{name}\".*site=8, user={DIM}"):
            build(name, mixed)
    for name in ("dcn", "wide_deep"):  # concatenations take any widths
        model, tables = build(name, mixed)
        assert tables[0].dim == 8
        assert model(dense_input(), embeddings_for(mixed, tables)).shape == (B,)


# -- a user's model -----------------------------------------------------------------------------

USER_MODULE = '''
import torch
from recsync.embedding.spec import TableSpec
from recsync.model.inputs import concat, feature_tables

class Sum(torch.nn.Module):
    def __init__(self, num_dense, scale):
        super().__init__()
        self.linear = torch.nn.Linear(num_dense, 1)
        self.scale = scale

    def forward(self, dense, embeddings):
        return self.linear(dense).squeeze(1) + self.scale * concat(embeddings).sum(1)

def build(inputs, scale=1.0):
    return Sum(inputs.num_dense, scale)

def build_with_tables(inputs, dim=2):
    return Sum(inputs.num_dense, 1.0), feature_tables(inputs, dim=dim, suffix=".mine")

def build_bad_source(inputs):
    return Sum(inputs.num_dense, 1.0), [TableSpec("x", 5, 2, source="nope")]

def build_not_a_module(inputs):
    return 42
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_ctr_model.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "my_ctr_model.py"


def test_user_model_by_module_name(user_module):
    model, tables = build_model(ModelConfig(name="my_ctr_model:build", params={"scale": 2.0},
                                            embedding_dim=3), INPUTS)
    assert model.scale == 2.0
    assert tables == feature_tables(apply_table_rows(ModelConfig(embedding_dim=3), INPUTS))
    assert model(dense_input(), embeddings_for(INPUTS, tables)).shape == (B,)
    _, tables = build_model(ModelConfig(name="my_ctr_model:build_with_tables",
                                        params={"dim": 5}), INPUTS)
    assert [(t.name, t.dim) for t in tables] == [("site.mine", 5), ("user.mine", 5),
                                                 ("tag.mine", 5)]


def test_user_model_by_file_path(user_module, monkeypatch):
    monkeypatch.chdir(user_module.parent)
    for name in (f"{user_module}:build", "my_ctr_model.py:build"):
        model, _ = build_model(ModelConfig(name=name), INPUTS)
        assert type(model).__name__ == "Sum"


def test_example_user_model():
    example = Path(__file__).resolve().parents[2] / "examples" / "user_model.py"
    model, tables = build_model(ModelConfig(name=f"{example}:build",
                                            params={"hidden": 8}), INPUTS)
    embs = embeddings_for(INPUTS, tables, requires_grad=True)
    model(dense_input(), embs).sum().backward()
    assert embs.stacked.grad is not None


def test_params_from_config():
    cfg = load_config(None, ['model.name="pkg.mod:build"', "model.params.scale=0.5",
                             "model.params.layers=[4, 2]"])
    assert cfg.model.params == {"scale": 0.5, "layers": [4, 2]}
    assert "[model.params]" in cfg.to_toml()


@pytest.mark.parametrize("name, message", [
    ("nosuchpkg_xyz.models:build", "model.name = 'nosuchpkg_xyz.models:build': cannot import "
                                   "'nosuchpkg_xyz.models' (ModuleNotFoundError"),
    ("my_ctr_model:nothing", "has no callable 'nothing'"),
    ("missing/file.py:build", "cannot import 'missing/file.py' (FileNotFoundError"),
    ("my_ctr_model:", "\"package.module:builder\""),
    ("my_ctr_model:build_bad_source", "reads data table 'nope'"),
    ("my_ctr_model:build_not_a_module", "returned int"),
])
def test_user_model_errors(user_module, name, message):
    with pytest.raises(ValueError) as e:
        build_model(ModelConfig(name=name), INPUTS)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_user_model_params_it_lacks(user_module):
    with pytest.raises(ValueError, match=r"model.params \['depth'\]"):
        build_model(ModelConfig(name="my_ctr_model:build", params={"depth": 3}), INPUTS)


def test_unknown_name_lists_the_builtins():
    with pytest.raises(ValueError) as e:
        build_model(ModelConfig(name="xdeepfm"), INPUTS)
    msg = str(e.value)
    assert "model.name" in msg and "'xdeepfm'" in msg and "package.module:builder" in msg
    for name in MODELS:
        assert name in msg


def test_params_are_for_user_models():
    with pytest.raises(ValueError, match="model.params is for a user's model"):
        build_model(ModelConfig(params={"x": 1}), INPUTS)
