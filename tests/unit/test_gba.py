"""GBA without Ray: the staleness decay, the aggregation buffer, a shard's token-controlled
aggregation (lost tokens, decay and drop counts, the final partial batch), and the oracle: gba
with M = N and no staleness is one step on the global batch, i.e. local training with batch
N·b, which the integration tests show mode sync equals too.

Run: .venv/bin/pytest -q tests/unit/test_gba.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

from fake_ps import fake_shards, patch_ray_get
from cores import push_gba, push_sync, test_core, worker_half
from recsync.config import ModelConfig, TrainConfig
from recsync.data.reader import Batch, Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.embedding.row_optim import RowSGD, make_row_optimizer
from recsync.embedding.spec import TableSpec
from recsync.model.setup import model_for
from recsync.modes.gba import GBAWorker
from recsync.ps.aggregation import GradientBuffer, StalenessDecay
from recsync.ps.client import PSClient
from recsync.ps.core import DenseState, ShardCore
from recsync.run.local_run import build_local_model, train_step

TABLES = [TableSpec("a", 40, 4), TableSpec("b", 25, 4)]
LR = 0.5


def i64(*v):
    return np.array(v, dtype=np.int64)


def f32(a):
    return np.asarray(a, dtype=np.float32)


# ------------------------------------------------------------------------------------ decay

def test_decay_counts_fresh_gradients_fully_and_weighs_stale_ones_by_kind():
    inv = StalenessDecay(2, "inverse")
    assert [inv.weight(t) for t in (0, 1, 2)] == [1.0, 1.0, 1.0]
    assert inv.weight(3) == pytest.approx(1 / 2) and inv.weight(6) == pytest.approx(1 / 5)
    drop = StalenessDecay(2, "drop")
    assert drop.weight(2) == 1.0 and drop.weight(3) == 0.0
    assert StalenessDecay(2, "none").weight(100) == 1.0
    with pytest.raises(ValueError, match="decay"):
        StalenessDecay(2, "linear")
    with pytest.raises(ValueError, match="threshold"):
        StalenessDecay(-1)


# ------------------------------------------------------------------------------------ buffer

def test_buffer_mean_aggregates_rows_by_id_weighted_over_all_samples():
    buf = GradientBuffer()
    g_a = [f32([[1, 1], [2, 2]]), f32([[4, 0]])]       # already x 3 samples
    g_b = [f32([[10, 0], [0, 10]]), f32(np.zeros((0, 2)))]  # already x 1 sample, weight 0.5
    buf.add([i64(5, 1), i64(3)], g_a, f32([3, 6]), 3)
    buf.add([i64(1, 9), i64()], g_b, f32([1, 1]), 1, weight=0.5)
    assert len(buf) == 2
    ids, grads, dense = buf.mean()
    np.testing.assert_array_equal(ids[0], [1, 5, 9])
    np.testing.assert_allclose(grads[0], [[(2 + 5) / 4, (2 + 0) / 4],   # id 1: both
                                          [1 / 4, 1 / 4],               # id 5: a only
                                          [0, 5 / 4]])                  # id 9: b only, halved
    np.testing.assert_array_equal(ids[1], [3])
    np.testing.assert_allclose(grads[1], [[1, 0]])
    np.testing.assert_allclose(dense, [(3 + 0.5) / 4, (6 + 0.5) / 4])
    assert len(buf) == 0 and buf.samples == 0 and buf.mean() is None  # emptied


# ------------------------------------------------------------------------------------ shard

def gba_core(num_workers, gradients=0, decay=StalenessDecay(4), dense=None) -> ShardCore:
    return test_core(TABLES, RowSGD(lr=LR), shard=0, num_shards=1, num_workers=num_workers,
                     seed=1, init_scale=0.05, dense=dense, gba_gradients=gradients, decay=decay)


NO_ROWS = ([i64(), i64()], [f32(np.zeros((0, 4)))] * 2)


def one_row(value: float, n: int = 1):
    """A push touching row 4 of table a with gradient ``value`` (x n samples)."""
    return [i64(4), i64()], [f32([[value * n] * 4]), f32(np.zeros((0, 4)))]


def test_shard_applies_the_mean_once_it_holds_m_gradients_whatever_their_senders():
    c = gba_core(num_workers=3)
    before = c.pull([i64(4), i64()])[0][0]
    assert push_gba(c, *one_row(1.0, 2), None, token=0, samples=2) == 0
    assert push_gba(c, *one_row(4.0), None, token=0, samples=1) == 0
    assert c.version == 0  # 2 of M = 3
    # the same worker again (a fast one takes several tokens per round)
    assert push_gba(c, *one_row(7.0), None, token=0, samples=1) == 0
    assert c.version == 1
    after = c.pull([i64(4), i64()])[0][0]
    np.testing.assert_allclose(after, before - LR * (2 + 4 + 7) / 4, rtol=1e-6)
    assert c.stats()["gba"] == {"applied": 3, "decayed": 0, "dropped": 0, "updates": 1}


def test_a_token_that_never_returns_stalls_nothing():
    """Three workers pull at version 0; worker 2 dies with its token. The buffer fills with
    the other workers' next gradients, and the run's final flush applies what is left."""
    c = gba_core(num_workers=3)
    for _ in range(2):
        push_gba(c, *one_row(1.0), None, token=0, samples=1)  # workers 0 and 1, step 1
    push_gba(c, *one_row(1.0), None, token=0, samples=1)      # worker 0, step 2
    assert c.version == 1
    push_gba(c, *one_row(1.0), None, token=1, samples=1)      # worker 1, step 2
    assert c.version == 1 and c.rule.end(c) == 1
    assert c.version == 2 and c.rule.end(c) == 0 and c.version == 2
    assert c.stats()["gba"]["updates"] == 2


def test_stale_gradients_are_decayed_or_dropped_and_counted():
    # fresh gradient 1 and stale gradient 4, one sample each. inverse: weight 1/2, both samples
    # count: (1 + 4/2) / 2. drop: the stale one and its sample are gone: 1 / 1.
    for kind, expect_delta, counts in (
            ("inverse", (1 + 4 / 2) / 2, {"applied": 2, "decayed": 1, "dropped": 0}),
            ("drop", 1 / 1, {"applied": 1, "decayed": 0, "dropped": 1})):
        c = gba_core(num_workers=2, gradients=2, decay=StalenessDecay(1, kind))
        for _ in range(4):  # version 2
            push_gba(c, *NO_ROWS, None, token=c.version, samples=1)
        before = c.pull([i64(4), i64()])[0][0]
        assert push_gba(c, *one_row(1.0), None, token=2, samples=1) == 0      # fresh
        assert push_gba(c, *one_row(4.0), None, token=0, samples=1) == 2      # τ = 2 > ι = 1
        c.rule.end(c)
        after = c.pull([i64(4), i64()])[0][0]
        np.testing.assert_allclose(after, before - LR * expect_delta, rtol=1e-6)
        gba = c.stats()["gba"]
        assert {k: gba[k] for k in counts} == {k: v + (4 if k == "applied" else 0)
                                               for k, v in counts.items()}


def test_dense_gradients_aggregate_like_rows():
    c = gba_core(num_workers=2, dense=DenseState(torch.tensor([1.0, 1.0]), "sgd", 0.1))
    push_gba(c, *NO_ROWS, f32([2.0, 0.0]), token=0, samples=2)
    push_gba(c, *NO_ROWS, f32([0.0, 4.0]), token=0, samples=2)
    np.testing.assert_allclose(c.pull([i64(), i64()])[1], [1 - 0.1 * 0.5, 1 - 0.1 * 1.0])


# ------------------------------------------------------------------------------------ straggler

def test_an_emulated_straggler_is_slow_between_computing_and_pushing(tiny, monkeypatch):
    """The slow-down falls after backward and before the push, so the gradient it delays was
    computed on the version pulled before the delay: a straggler's gradients arrive stale."""
    patch_ray_get(monkeypatch)
    model_cfg = ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8])
    (model, tables), (other_model, _) = (
        (b.module, b.tables) for b in (model_for(model_cfg, tiny) for _ in range(2)))
    init = parameters_to_vector(model.parameters()).detach().clone()
    c = test_core(tables, RowSGD(lr=LR), shard=0, num_shards=1, num_workers=2, seed=1,
                  dense=DenseState(init, "sgd", 0.1), decay=StalenessDecay(0, "none"),
                  mode="gba")
    straggler, other = (worker_half(GBAWorker, m, PSClient(fake_shards([c]),
                                                           [t.dim for t in tables], dense_shard=0))
                        for m in (model, other_model))
    batches = list(tiny.batches(tiny.chunks("train", 256)[0], 32))
    seen = []

    def after_compute(compute_s):  # while the straggler "sleeps", the other makes 2 updates
        assert compute_s > 0 and model.bottom[0].weight.grad is not None  # after backward
        seen.append(c.stats()["pushes"])  # the straggler's push is not sent yet
        for b in batches[1:5]:
            other.step(b)

    straggler.ctx.after_compute = after_compute
    straggler.step(batches[0])
    assert seen == [0]
    assert c.staleness == {0: 4, 2: 1}  # the straggler's gradient: pulled at 0, applied at 2


# ------------------------------------------------------------------------------------ oracle

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_gba")
    generate(root, rows=1024, eval_rows=128, spec=SynthSpec(seed=6, max_table_rows=40),
             processes=1, progress=False)
    return Dataset(root)


def test_gba_with_m_equal_n_and_no_staleness_equals_one_step_on_the_global_batch(
        tiny, monkeypatch):
    """Two workers, two shards, batch b each; in every round both pull before either pushes
    (no staleness), so each update is the mean over 2b samples: local training with batch 2b."""
    patch_ray_get(monkeypatch)
    torch.set_num_threads(1)
    model_cfg = ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8],
                            embedding_init_scale=0.3)
    train_cfg = TrainConfig(embedding_optimizer="adagrad", embedding_lr=0.3,
                            dense_optimizer="adagrad", dense_lr=0.05, seed=3,
                            dense_precision="float32")  # an equality: bfloat16 rounds apart
    local = build_local_model(model_cfg, train_cfg, tiny)
    replicas = []
    for _ in range(2):
        torch.manual_seed(train_cfg.seed)
        built = model_for(model_cfg, tiny)
        replicas.append((built.module, built.tables))
    tables = replicas[0][1]
    init = parameters_to_vector(local.dense.parameters()).detach().clone()
    row_optimizer = make_row_optimizer("adagrad", 0.3,
                                       weight_decay=train_cfg.embedding_weight_decay)
    cores = [test_core(tables, row_optimizer, shard=s, num_shards=2,
                       num_workers=2, seed=train_cfg.seed, init_scale=0.3,
                       dense=DenseState(init, "adagrad", 0.05,
                                        warmup_steps=train_cfg.dense_warmup_steps)
                       if s == 0 else None,
                       decay=StalenessDecay(0, "drop"),  # any staleness would show as drops
                       mode="gba")
              for s in range(2)]
    workers = [worker_half(GBAWorker, model, PSClient(fake_shards(cores), [t.dim for t in tables],
                                                      dense_shard=0, push_window=1))
               for model, _ in replicas]

    b = 32
    batches = list(tiny.batches(tiny.chunks("train", 2 * b * 6)[0], b))
    for k in range(6):
        part_a, part_b = batches[2 * k], batches[2 * k + 1]
        for w, part in zip(workers, (part_a, part_b)):
            w.step(part)
        train_step(local, Batch(*(torch.cat([getattr(p, f) for p in (part_a, part_b)])
                                  for f in ("dense", "sparse", "label"))))
    assert all(c.version == 6 for c in cores)
    assert sum(c.stats()["gba"]["dropped"] for c in cores) == 0
    gba_dense = torch.from_numpy(cores[0].pull([i64()] * len(tables))[1])
    local_dense = parameters_to_vector(local.dense.parameters()).detach()
    torch.testing.assert_close(gba_dense, local_dense, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(local_dense, init)  # training moved the parameters
    ids = torch.cat([p.sparse for p in batches[:12]])
    torch.testing.assert_close(workers[0].ctx.client.pull(ids).embeddings(),
                               local.lookup.pull(ids).embeddings(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ switching

def test_dense_state_moves_to_the_ps_and_back_whole():
    c = gba_core(num_workers=2)
    opt = torch.optim.Adagrad([torch.zeros(2, requires_grad=True)], lr=0.1).state_dict()
    opt["state"] = {0: {"sum": torch.tensor([4.0, 9.0]), "step": torch.tensor(3.0)}}
    c.install_dense(f32([1.0, 2.0]), "adagrad", 0.1, opt)
    push_gba(c, *NO_ROWS, f32([2.0, 3.0]), token=0, samples=1)
    push_gba(c, *NO_ROWS, f32([2.0, 3.0]), token=0, samples=1)
    out = c.take_dense()
    # Adagrad continued from the handed state: sum 4 + 2² = 8, 9 + 3² = 18
    torch.testing.assert_close(out["optimizer"]["state"][0]["sum"], torch.tensor([8.0, 18.0]))
    expected = [1.0 - 0.1 * 2 / (8 ** 0.5 + 1e-10), 2.0 - 0.1 * 3 / (18 ** 0.5 + 1e-10)]
    np.testing.assert_allclose(out["params"], expected, rtol=1e-6)
    assert c.pull([i64(), i64()])[1] is None  # the shard holds no dense vector any more
    with pytest.raises(ValueError, match="no dense"):
        c.take_dense()


def test_begin_sync_aligns_versions_and_refuses_buffered_gradients():
    c = gba_core(num_workers=2)
    push_gba(c, *one_row(1.0), None, token=0, samples=1)
    with pytest.raises(ValueError, match="end the rule first"):
        c.advance_to(5)
    c.rule.end(c)
    with pytest.raises(ValueError, match="step 0"):
        c.advance_to(0)
    c.advance_to(5)
    assert c.version == 5
    assert push_sync(c, 5, *NO_ROWS, None, 0) is False  # sync steps count on from there
