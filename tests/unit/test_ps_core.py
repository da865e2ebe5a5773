"""ShardCore and DenseState: one parameter-server shard's pull, async push, sync push, dense
parameters, and PSClient's merge of shard answers (plain Python, no Ray cluster)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cores import test_core, push, push_sync
from recsync.embedding.lookup import LocalLookup
from recsync.embedding.row_optim import RowSGD
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore
from recsync.ps.client import PSClient
from recsync.ps.core import DenseState, ShardCore
from fake_ps import fake_shards, patch_ray_get, readonly

TABLES = [TableSpec("a", 40, 4), TableSpec("b", 25, 4)]
LR, SEED, SCALE = 0.5, 7, 0.05
SHARD, NUM_SHARDS = 1, 3


def core(num_workers=1, dense=None, shard=SHARD, num_shards=NUM_SHARDS) -> ShardCore:
    return test_core(TABLES, RowSGD(lr=LR), shard=shard, num_shards=num_shards,
                     num_workers=num_workers, seed=SEED, init_scale=SCALE, dense=dense)


def i64(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def rows_of(c: ShardCore, ids: list[np.ndarray]) -> list[np.ndarray]:
    return c.pull(ids)[0]


def grads(rng, n, dim=4) -> np.ndarray:
    return f32(rng.standard_normal((n, dim)))


# ------------------------------------------------------------------------------------ pull

def test_pull_equals_an_unsharded_stores_initial_rows_and_version_0():
    ids = [i64(1, 4, 37, 19, 4), i64(22, 1, 7)]  # every id % 3 == 1, duplicates allowed
    assert all((i % NUM_SHARDS == SHARD).all() for i in ids)
    c = core()
    rows, dense, version = c.pull(ids)
    whole = EmbeddingStore(TABLES, RowSGD(lr=LR), seed=SEED, init_scale=SCALE)
    for t, i in enumerate(ids):
        expected = whole.pull(t, torch.from_numpy(i)).numpy()
        assert rows[t].dtype == np.float32 and rows[t].shape == (len(i), 4)
        np.testing.assert_array_equal(rows[t], expected)
    assert not np.array_equal(rows[0][0], rows[1][1])  # same id 1, different table -> different row
    assert dense is None and version == 0
    assert c.stats()["pulls"] == 1 and c.stats()["pushes"] == 0
    assert c.stats()["rows_touched"] == 4 + 3  # unique rows only


def test_pull_returns_the_dense_vector_as_a_copy():
    vec = torch.tensor([1.0, -2.0, 3.0])
    c = core(dense=DenseState(vec, "sgd", 0.1))
    _, dense, version = c.pull([i64(), i64()])
    np.testing.assert_array_equal(dense, vec.numpy())
    assert version == 0
    push(c, [i64(), i64()], [f32(np.zeros((0, 4)))] * 2, f32([1, 1, 1]), version_read=0)
    np.testing.assert_array_equal(dense, vec.numpy())  # the pulled vector did not move
    np.testing.assert_allclose(c.pull([i64(), i64()])[1], vec.numpy() - 0.1, rtol=1e-6)


# ------------------------------------------------------------------------------------ async

def test_async_push_applies_at_once_and_counts_staleness():
    rng = np.random.default_rng(0)
    c = core()
    ids = [i64(4, 10), i64(7)]
    before = rows_of(c, ids)
    g1 = [grads(rng, 2), grads(rng, 1)]
    assert push(c, ids, g1, None, version_read=0) == 0
    assert c.version == 1
    after1 = rows_of(c, ids)
    for t in range(2):
        np.testing.assert_allclose(after1[t], before[t] - LR * g1[t], rtol=1e-6, atol=1e-7)

    g2 = [grads(rng, 2), grads(rng, 1)]
    assert push(c, ids, g2, None, version_read=0) == 1  # read at version 0, applied at 1
    assert c.version == 2
    after2 = rows_of(c, ids)
    for t in range(2):
        np.testing.assert_allclose(after2[t], after1[t] - LR * g2[t], rtol=1e-6, atol=1e-7)

    st = c.stats()
    assert st["version"] == 2 and st["pushes"] == 2
    assert st["staleness"] == {0: 1, 1: 1}


def test_async_push_lr_scale_scales_the_row_step():
    rng = np.random.default_rng(1)
    c = core()
    ids = [i64(13), i64()]
    before = rows_of(c, ids)
    g = [grads(rng, 1), f32(np.zeros((0, 4)))]
    push(c, ids, g, None, version_read=0, lr_scale=0.25)
    np.testing.assert_allclose(rows_of(c, ids)[0], before[0] - 0.25 * LR * g[0], rtol=1e-6,
                               atol=1e-7)


def test_async_push_leaves_rows_it_was_not_given_alone():
    rng = np.random.default_rng(2)
    c = core()
    other = [i64(1, 16), i64(4)]
    before = rows_of(c, other)
    push(c, [i64(4), i64(1)], [grads(rng, 1), grads(rng, 1)], None, version_read=0)
    for b, a in zip(before, rows_of(c, other)):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------ sync

def test_sync_applies_the_sample_weighted_mean_once_all_workers_pushed():
    rng = np.random.default_rng(3)
    c = core(num_workers=2)
    n_a, n_b = 3, 1
    # table 0: id 4 pushed by both, 1 only by a, 7 only by b (b's ids are not sorted)
    ids_a = [i64(1, 4), i64(10)]
    ids_b = [i64(7, 4), i64()]
    g_a = [grads(rng, 2), grads(rng, 1)]
    g_b = [grads(rng, 2), f32(np.zeros((0, 4)))]
    probe = [i64(1, 4, 7), i64(10)]
    before = rows_of(c, probe)

    assert push_sync(c, 0, ids_a, [g * n_a for g in g_a], None, n_a) is False
    assert c.version == 0
    for b, a in zip(before, rows_of(c, probe)):
        np.testing.assert_array_equal(a, b)  # nothing applied yet

    assert push_sync(c, 0, ids_b, [g * n_b for g in g_b], None, n_b) is True
    assert c.version == 1
    total = n_a + n_b
    after = rows_of(c, probe)
    exp_0 = before[0].copy()
    exp_0[0] -= LR * (g_a[0][0] * n_a) / total                      # id 1: only a
    exp_0[1] -= LR * (g_a[0][1] * n_a + g_b[0][1] * n_b) / total    # id 4: both
    exp_0[2] -= LR * (g_b[0][0] * n_b) / total                      # id 7: only b
    np.testing.assert_allclose(after[0], exp_0, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(after[1], before[1] - LR * (g_a[1] * n_a) / total, rtol=1e-5,
                               atol=1e-7)
    st = c.stats()
    assert st["pushes"] == 2 and st["version"] == 1 and st["staleness"] == {0: 2}


def test_sync_step_result_does_not_depend_on_push_order():
    rng = np.random.default_rng(4)
    ids_a, ids_b = [i64(1, 4), i64(10)], [i64(4, 7), i64(10)]
    g_a = [grads(rng, 2) * 2, grads(rng, 1) * 2]
    g_b = [grads(rng, 2) * 5, grads(rng, 1) * 5]
    probe = [i64(1, 4, 7), i64(10)]
    results = []
    for order in ((ids_a, g_a, 2), (ids_b, g_b, 5)), ((ids_b, g_b, 5), (ids_a, g_a, 2)):
        c = core(num_workers=2)
        for ids, g, n in order:
            push_sync(c, 0, ids, g, None, n)
        results.append(rows_of(c, probe))
    for x, y in zip(*results):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-8)


def test_sync_push_for_the_wrong_step_is_rejected():
    c = core(num_workers=2)
    empty = ([i64(), i64()], [f32(np.zeros((0, 4)))] * 2)
    with pytest.raises(ValueError, match="step 1"):
        push_sync(c, 1, *empty, None, 0)
    assert push_sync(c, 0, *empty, None, 0) is False
    assert push_sync(c, 0, *empty, None, 0) is True
    for step in (0, 2):
        with pytest.raises(ValueError, match=f"step {step}"):
            push_sync(c, step, *empty, None, 0)
    assert c.version == 1
    assert push_sync(c, 1, *empty, None, 0) is False  # the right step is still accepted


def test_sync_step_with_zero_samples_advances_the_version_only():
    c = core(num_workers=2)
    probe = [i64(1, 4), i64(7)]
    before = rows_of(c, probe)
    empty = ([i64(), i64()], [f32(np.zeros((0, 4)))] * 2)
    assert push_sync(c, 0, *empty, None, 0) is False
    assert push_sync(c, 0, *empty, None, 0) is True
    assert c.version == 1
    for b, a in zip(before, rows_of(c, probe)):
        np.testing.assert_array_equal(a, b)


def test_sync_worker_without_a_batch_still_counts_and_dilutes_nothing_it_did_not_push():
    """A worker with no batch pushes (nothing, 0 samples): the step completes with the other
    worker's gradient divided by its own sample count."""
    rng = np.random.default_rng(5)
    c = core(num_workers=2)
    ids = [i64(4), i64()]
    before = rows_of(c, ids)
    g = grads(rng, 1)
    assert push_sync(c, 0, [i64(), i64()], [f32(np.zeros((0, 4)))] * 2, None, 0) is False
    assert push_sync(c, 0, ids, [g * 6, f32(np.zeros((0, 4)))], None, 6) is True
    np.testing.assert_allclose(rows_of(c, ids)[0], before[0] - LR * g, rtol=1e-5, atol=1e-7)


def test_drop_pending_forgets_an_incomplete_step():
    rng = np.random.default_rng(6)
    c = core(num_workers=2)
    ids = [i64(4), i64()]
    before = rows_of(c, ids)
    push_sync(c, 0, ids, [grads(rng, 1), f32(np.zeros((0, 4)))], None, 1)
    assert c.rule.drop_incomplete(c) == 1
    # the rebuilt group redoes step 0: it needs both workers again
    g = grads(rng, 1)
    assert push_sync(c, 0, ids, [g, f32(np.zeros((0, 4)))], None, 1) is False
    assert push_sync(c, 0, [i64(), i64()], [f32(np.zeros((0, 4)))] * 2, None, 1) is True
    np.testing.assert_allclose(rows_of(c, ids)[0], before[0] - LR * g / 2, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------ dense

def dense_core(num_workers=1, lr=0.1, vec=(1.0, -2.0, 0.5)):
    return core(num_workers=num_workers, dense=DenseState(torch.tensor(vec), "sgd", lr))


NO_ROWS = ([i64(), i64()], [f32(np.zeros((0, 4)))] * 2)


def test_dense_async_push_moves_the_vector_by_minus_lr_grad():
    c = dense_core(lr=0.1)
    v0 = c.pull(NO_ROWS[0])[1]
    g = f32([1.0, 2.0, -4.0])
    push(c, *NO_ROWS, g, version_read=0)
    np.testing.assert_allclose(c.pull(NO_ROWS[0])[1], v0 - 0.1 * g, rtol=1e-6)
    assert c.version == 1


def test_dense_sync_applies_the_sum_over_total_samples():
    c = dense_core(num_workers=2, lr=0.1)
    v0 = c.pull(NO_ROWS[0])[1]
    d_a, d_b = f32([3.0, 0.0, 6.0]), f32([1.0, 4.0, -2.0])  # already x samples (3 and 1)
    assert push_sync(c, 0, *NO_ROWS, d_a, 3) is False
    np.testing.assert_array_equal(c.pull(NO_ROWS[0])[1], v0)
    assert push_sync(c, 0, *NO_ROWS, d_b, 1) is True
    np.testing.assert_allclose(c.pull(NO_ROWS[0])[1], v0 - 0.1 * (d_a + d_b) / 4, rtol=1e-6)


@pytest.mark.parametrize("first_without_dense", [True, False])
def test_dense_sync_worker_without_a_dense_grad_does_not_drop_the_others(first_without_dense):
    c = dense_core(num_workers=2, lr=0.1)
    v0 = c.pull(NO_ROWS[0])[1]
    d = f32([2.0, -2.0, 4.0])
    pushes = [(None, 0), (d, 2)]
    if not first_without_dense:
        pushes.reverse()
    for grad, n in pushes:
        push_sync(c, 0, *NO_ROWS, grad, n)
    assert c.version == 1
    np.testing.assert_allclose(c.pull(NO_ROWS[0])[1], v0 - 0.1 * d / 2, rtol=1e-6)


def test_dense_grad_to_a_shard_without_dense_is_rejected_and_changes_nothing():
    rng = np.random.default_rng(7)
    c = core(num_workers=1)
    ids = [i64(4), i64(7)]
    before = rows_of(c, ids)
    g = [grads(rng, 1), grads(rng, 1)]
    with pytest.raises(ValueError, match="dense"):
        push(c, ids, g, f32([1.0]), version_read=0)
    with pytest.raises(ValueError, match="dense"):
        push_sync(c, 0, ids, g, f32([1.0]), 1)
    assert c.version == 0 and c.stats()["pushes"] == 0
    for b, a in zip(before, rows_of(c, ids)):
        np.testing.assert_array_equal(a, b)
    # the shard is still usable: a correct push of step 0 completes it
    assert push_sync(c, 0, ids, g, None, 1) is True
    np.testing.assert_allclose(rows_of(c, ids)[0], before[0] - LR * g[0], rtol=1e-6, atol=1e-7)


def test_dense_state_lr_scale_scales_one_step_then_restores_the_lr():
    s = DenseState(torch.tensor([1.0, 1.0]), "sgd", 0.2)
    s.apply(torch.tensor([1.0, -1.0]), lr_scale=0.5)
    torch.testing.assert_close(s.params.detach(), torch.tensor([0.9, 1.1]))
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
    s.apply(torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(s.params.detach(), torch.tensor([0.7, 1.3]))
    s.apply(torch.tensor([1.0, -1.0]), lr_scale=0.25)  # scales the base lr, not the last one
    torch.testing.assert_close(s.params.detach(), torch.tensor([0.65, 1.35]))


def test_dense_state_copies_its_initial_vector():
    vec = torch.tensor([1.0, 2.0])
    s = DenseState(vec, "sgd", 1.0)
    s.apply(torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(vec, torch.tensor([1.0, 2.0]))


# ------------------------------------------------------------------------------------ read-only

def test_read_only_arrays_are_accepted():
    rng = np.random.default_rng(8)
    c = dense_core(num_workers=1, lr=0.1)
    ids = [readonly(i64(4, 1)), readonly(i64(7))]
    before, v0, _ = c.pull(ids)
    g = [readonly(grads(rng, 2)), readonly(grads(rng, 1))]
    d = readonly(f32([1.0, 1.0, 1.0]))
    push(c, ids, g, d, version_read=0)
    after, v1, _ = c.pull(ids)
    for t in range(2):
        np.testing.assert_allclose(after[t], before[t] - LR * g[t], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v1, v0 - 0.1 * d, rtol=1e-6)
    assert push_sync(c, 1, ids, g, d, 1) is True
    after2, v2, _ = c.pull(ids)
    for t in range(2):
        np.testing.assert_allclose(after2[t], after[t] - LR * g[t], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v2, v1 - 0.1 * d, rtol=1e-6)
    assert not g[0].flags.writeable and not ids[0].flags.writeable  # inputs left as given


# ------------------------------------------------------------------------------------ client

def test_ps_client_over_three_shards_equals_a_local_store(monkeypatch):
    patch_ray_get(monkeypatch)
    cores = [core(shard=s, num_shards=3) for s in range(3)]
    client = PSClient(fake_shards(cores), [t.dim for t in TABLES], push_window=1)
    local = LocalLookup(EmbeddingStore(TABLES, RowSGD(lr=LR), seed=SEED, init_scale=SCALE))
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        sparse = torch.stack([torch.randint(0, t.rows, (12,), generator=gen) for t in TABLES], 1)
        remote, here = client.pull(sparse), local.pull(sparse)
        torch.testing.assert_close(remote.embeddings(), here.embeddings(), rtol=1e-5, atol=1e-6)
        weights = torch.randn(12, len(TABLES), 4, generator=gen)
        for p in (remote, here):
            (p.embeddings().stacked * weights).sum().backward()
        client.push(remote)
        local.push(here)
    client.flush()
    assert sum(c.version for c in cores) == 9  # every shard got every step's push
    sparse = torch.stack([torch.arange(40), torch.arange(40) % 25], 1)  # every row of both
    torch.testing.assert_close(client.pull(sparse).embeddings(), local.pull(sparse).embeddings(),
                               rtol=1e-5, atol=1e-6)
