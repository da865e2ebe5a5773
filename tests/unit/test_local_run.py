"""The local trainer against a hand-written reference loop; learning; evaluation."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from recsync.config import ModelConfig, TrainConfig
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.embedding.store import initial_rows
from recsync.metrics.evaluate import evaluate
from recsync.model.inputs import inputs_of
from recsync.run.local_run import build_local_model, train_step


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Small tables (at most 40 rows), so that batches repeat ids within and across steps."""
    root = tmp_path_factory.mktemp("tiny")
    generate(root, rows=512, eval_rows=256, spec=SynthSpec(seed=5, max_table_rows=40),
             processes=1, progress=False)
    return Dataset(root)


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    root = tmp_path_factory.mktemp("learnable")
    generate(root, rows=40_000, eval_rows=5_000, spec=SynthSpec(seed=1, max_table_rows=300),
             processes=1, progress=False)
    return Dataset(root)


MODEL = ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8, 4], embedding_init_scale=0.3)


# ------------------------------------------------------------------------------------ the oracle

def test_local_training_matches_a_reference_loop(tiny):
    """recsync's step (dedup, pull, push through a row-wise SGD store) is plain SGD on a model
    whose tables are ordinary dense nn.Embedding parameters."""
    train_cfg = TrainConfig(embedding_optimizer="sgd", embedding_lr=0.3, dense_optimizer="sgd",
                            dense_lr=0.2, dense_warmup_steps=0, seed=7,
                            dense_precision="float32")  # the reference loop is float32
    m = build_local_model(MODEL, train_cfg, tiny)
    store = m.lookup.store

    ref_dense = copy.deepcopy(m.dense)  # same initial dense weights
    ref_tables = nn.ModuleList()
    for t, spec in enumerate(store.tables):
        emb = nn.Embedding(spec.rows, spec.dim, sparse=False)
        with torch.no_grad():  # the same initial rows, computed independently of the store
            emb.weight.copy_(initial_rows(7, t, torch.arange(spec.rows), spec.dim, 0.3))
        ref_tables.append(emb)
    ref_opt = torch.optim.SGD([{"params": ref_dense.parameters(), "lr": 0.2},
                               {"params": ref_tables.parameters(), "lr": 0.3}])

    chunk = tiny.chunks("train", 512)[0]
    batches = list(tiny.batches(chunk, 64))[:6]
    # the batches really do repeat ids, so duplicate-gradient summing is exercised
    assert any(len(torch.unique(b.sparse[:, 2])) < len(b) for b in batches)

    for batch in batches:
        loss = train_step(m, batch)
        logits = ref_dense(batch.dense, [emb(batch.sparse[:, t])
                                         for t, emb in enumerate(ref_tables)])
        ref_loss = F.binary_cross_entropy_with_logits(logits, batch.label)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert loss == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-6)

    for (name, p), q in zip(m.dense.named_parameters(), ref_dense.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name
    moved = 0
    for t, emb in enumerate(ref_tables):
        every = torch.arange(emb.num_embeddings)
        ours = store.pull(t, every)
        assert torch.allclose(ours, emb.weight.detach(), atol=1e-5), f"table {t}"
        moved += int((ours != initial_rows(7, t, every, 4, 0.3)).any(dim=1).sum())
    assert moved > 100  # training did move rows (the comparison is not of untouched tables)


def test_adagrad_run_differs_from_sgd(tiny):
    """The configured optimizers are the ones used."""
    batch = next(tiny.batches(tiny.chunks("train", 512)[0], 64))
    rows = []
    for opt in ("sgd", "adagrad"):
        m = build_local_model(MODEL, TrainConfig(embedding_optimizer=opt, dense_optimizer=opt,
                                                 seed=7), tiny)
        train_step(m, batch)
        rows.append(m.lookup.store.pull(0, batch.sparse[:, 0]))
        assert isinstance(m.dense_optimizer, {"sgd": torch.optim.SGD,
                                              "adagrad": torch.optim.Adagrad}[opt])
    assert not torch.allclose(rows[0], rows[1])


def test_same_seed_same_model(tiny):
    a = build_local_model(MODEL, TrainConfig(seed=3), tiny)
    b = build_local_model(MODEL, TrainConfig(seed=3), tiny)
    c = build_local_model(MODEL, TrainConfig(seed=4), tiny)
    for p, q, r in zip(a.dense.parameters(), b.dense.parameters(), c.dense.parameters()):
        assert torch.equal(p, q)
    assert not all(torch.equal(p, r) for p, r in zip(a.dense.parameters(), c.dense.parameters()))


# ------------------------------------------------------------------------------------ learning

def test_training_reduces_the_loss_and_evaluate_is_sensible(learnable):
    torch.manual_seed(0)
    m = build_local_model(ModelConfig(embedding_dim=8, bottom_mlp=[16], top_mlp=[16]),
                          TrainConfig(seed=0, embedding_lr=0.1, dense_lr=0.05), learnable)
    before = evaluate(m.dense, m.lookup, learnable, 5_000, 2_048)
    losses = []
    for chunk in learnable.chunks("train", 4096):
        for batch in learnable.batches(chunk, 128, shuffle_seed=0):
            losses.append(train_step(m, batch))
    assert len(losses) == sum(math.ceil(c.rows / 128) for c in learnable.chunks("train", 4096))
    assert len(losses) > 300
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-50:]) < np.mean(losses[:20]) - 0.05

    after = evaluate(m.dense, m.lookup, learnable, 5_000, 2_048)
    assert after["rows"] == 5_000
    assert 0.0 <= after["auc"] <= 1.0 and after["logloss"] > 0
    ctr = learnable.synthetic["eval_ctr"]
    constant = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))
    assert after["logloss"] < constant - 0.05       # better than predicting the base rate
    assert after["auc"] > 0.75 and after["auc"] > before["auc"] + 0.15
    assert after["auc"] < learnable.synthetic["bayes_auc"] + 0.01  # the ceiling holds
    assert m.dense.training  # evaluate puts the model back into training mode


def test_evaluate_rows_and_determinism(tiny):
    m = build_local_model(MODEL, TrainConfig(seed=1), tiny)
    a = evaluate(m.dense, m.lookup, tiny, 100, 32)
    assert a["rows"] == 100
    assert evaluate(m.dense, m.lookup, tiny, 100, 7) == pytest.approx(a)  # any batch size
    assert evaluate(m.dense, m.lookup, tiny, 10**9, 64)["rows"] == 256  # capped at the split
    assert evaluate(m.dense, m.lookup, tiny, 0, 64)["rows"] == 0


def test_evaluate_does_not_train(tiny):
    m = build_local_model(MODEL, TrainConfig(seed=1), tiny)
    params = [p.clone() for p in m.dense.parameters()]
    evaluate(m.dense, m.lookup, tiny, 256, 64)
    every = torch.arange(40)
    rows = m.lookup.store.pull(2, every)
    evaluate(m.dense, m.lookup, tiny, 256, 64)
    assert all(torch.equal(p, q) for p, q in zip(params, m.dense.parameters()))
    assert torch.equal(rows, m.lookup.store.pull(2, every))


# ------------------------------------------------------------------------------------ table_rows

def test_table_rows(tiny):
    rows = [t.rows for t in inputs_of(tiny, ModelConfig()).tables]
    assert rows == tiny.table_rows
    assert [t.rows for t in inputs_of(tiny, ModelConfig(table_rows=max(rows))).tables] == \
        [max(rows)] * 26
    with pytest.raises(ValueError, match="smaller than the data set's largest table"):
        inputs_of(tiny, ModelConfig(table_rows=max(rows) - 1))
    m = build_local_model(ModelConfig(table_rows=64, embedding_dim=2, bottom_mlp=[4],
                                      top_mlp=[4]), TrainConfig(), tiny)
    assert [t.rows for t in m.lookup.store.tables] == [64] * 26


def test_table_rows_smaller_than_the_data_is_rejected(tiny):
    with pytest.raises(ValueError, match=r"model\.table_rows") as e:
        build_local_model(ModelConfig(table_rows=39), TrainConfig(), tiny)
    assert "40" in str(e.value)
