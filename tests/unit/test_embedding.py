"""Embedding rows: initialisation, the store, row optimizers, sharding, the local lookup."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recsync.embedding.lookup import LocalLookup, LookupPlan
from recsync.embedding.row_optim import RowAdagrad, RowSGD, make_row_optimizer
from recsync.embedding.sharding import local_index, rows_on_shard, shard_of, split_by_shard
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore, initial_rows

TABLES = [TableSpec("a", 50, 4), TableSpec("b", 7, 4), TableSpec("c", 1000, 3)]


def store(optimizer=None, **kw):
    return EmbeddingStore(TABLES, optimizer or RowSGD(lr=0.1), seed=kw.pop("seed", 11),
                          init_scale=kw.pop("init_scale", 0.05), **kw)


def ids(*values):
    return torch.tensor(values, dtype=torch.int64)


# ------------------------------------------------------------------------------------ init

def test_initial_rows_are_deterministic_and_in_range():
    x = torch.arange(5000, dtype=torch.int64)
    a = initial_rows(3, 1, x, 8, 0.25)
    assert a.shape == (5000, 8) and a.dtype == torch.float32
    assert torch.equal(a, initial_rows(3, 1, x, 8, 0.25))
    assert a.min() >= -0.25 and a.max() < 0.25
    # uniform over the whole range, not a narrow band
    assert a.min() < -0.24 and a.max() > 0.24
    assert abs(a.mean().item()) < 0.01
    assert a.std().item() == pytest.approx(0.5 / 12 ** 0.5, rel=0.05)


def test_initial_rows_depend_on_id_only_not_on_the_batch():
    x = ids(9, 2, 400, 2)
    rows = initial_rows(3, 1, x, 4, 0.1)
    for i, v in enumerate(x.tolist()):
        assert torch.equal(rows[i], initial_rows(3, 1, ids(v), 4, 0.1)[0])
    assert torch.equal(rows[1], rows[3])


def test_initial_rows_differ_across_seed_table_id_and_column():
    x = torch.arange(100, dtype=torch.int64)
    base = initial_rows(3, 1, x, 4, 0.1)
    assert not torch.equal(base, initial_rows(4, 1, x, 4, 0.1))
    assert not torch.equal(base, initial_rows(3, 2, x, 4, 0.1))
    assert len(torch.unique(base)) > 390  # ids and columns draw different numbers
    assert torch.allclose(initial_rows(3, 1, x, 4, 0.2), 2 * base)


def test_store_rows_start_at_initial_rows():
    s = store()
    x = ids(3, 49, 0, 3)
    assert torch.equal(s.pull(0, x), initial_rows(11, 0, x, 4, 0.05))
    assert torch.equal(s.pull(2, ids(999)), initial_rows(11, 2, ids(999), 3, 0.05))


def test_initial_rows_independent_of_sharding():
    single = store()
    shards = [store(shard=s, num_shards=3) for s in range(3)]
    for t, spec in enumerate(TABLES):
        every = torch.arange(spec.rows, dtype=torch.int64)
        expected = single.pull(t, every)
        got = torch.empty_like(expected)
        for s, pos in enumerate(split_by_shard(every, 3)):
            got[pos] = shards[s].pull(t, every[pos])
        assert torch.equal(got, expected)
    assert sum(sh.num_initialized() for sh in shards) == single.num_initialized()


def test_sharded_pushes_match_a_single_store():
    single = store(RowAdagrad(lr=0.3))
    shards = [store(RowAdagrad(lr=0.3), shard=s, num_shards=3) for s in range(3)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randperm(50, generator=gen)[:20]
        g = torch.randn(20, 4, generator=gen)
        single.push(0, x, g)
        for s, pos in enumerate(split_by_shard(x, 3)):
            shards[s].push(0, x[pos], g[pos])
    every = torch.arange(50)
    for s, pos in enumerate(split_by_shard(every, 3)):
        assert torch.allclose(shards[s].pull(0, every[pos]), single.pull(0, every[pos]))


def test_store_rejects_a_bad_shard():
    with pytest.raises(ValueError, match="shard"):
        store(shard=3, num_shards=3)


def test_table_spec_validates():
    with pytest.raises(ValueError, match="rows"):
        TableSpec("x", 0, 4)
    with pytest.raises(ValueError, match="dim"):
        TableSpec("x", 5, 0)


# ------------------------------------------------------------------------------------ store

def test_pull_returns_a_copy():
    s = store()
    x = ids(1, 2)
    first = s.pull(0, x)
    kept = first.clone()
    first += 100.0                       # the caller scribbling on its copy ...
    assert torch.equal(s.pull(0, x), kept)  # ... does not reach the store
    s.push(0, x, torch.ones(2, 4))       # and a later push does not change what was pulled
    assert torch.equal(first, kept + 100.0)
    assert not torch.equal(s.pull(0, x), kept)


def test_lazy_initialisation_counts_touched_rows():
    s = store()
    assert s.num_initialized() == 0
    s.pull(0, ids(1, 2, 2, 5))
    assert s.num_initialized() == 3
    s.pull(0, ids(1, 5))
    assert s.num_initialized() == 3
    s.pull(1, ids(1))                 # the same id in another table is another row
    assert s.num_initialized() == 4
    s.push(2, ids(10, 11), torch.zeros(2, 3))  # pushing to untouched rows initialises them
    assert s.num_initialized() == 6
    # a pushed-but-never-pulled row started from its initial value
    assert torch.equal(s.pull(2, ids(10)), initial_rows(11, 2, ids(10), 3, 0.05))


def test_push_sgd_matches_hand_computation():
    lr = 0.1
    s = store(RowSGD(lr=lr))
    x = ids(4, 0, 17)
    rows0 = initial_rows(11, 0, x, 4, 0.05)
    g1, g2 = torch.randn(3, 4), torch.randn(3, 4)
    s.push(0, x, g1)
    s.push(0, x[:2], g2[:2])
    expected = rows0 - lr * g1
    expected[:2] -= lr * g2[:2]
    assert torch.allclose(s.pull(0, x), expected, atol=1e-7)
    assert torch.equal(s.pull(0, ids(5)), initial_rows(11, 0, ids(5), 4, 0.05))  # untouched


def test_push_adagrad_matches_hand_computation():
    lr, eps = 0.5, 1e-8
    s = store(RowAdagrad(lr=lr, eps=eps))
    x = ids(4, 0, 17)
    rows = initial_rows(11, 0, x, 4, 0.05).double()
    state = torch.zeros(3, 1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        g = torch.randn(3, 4, generator=gen)
        s.push(0, x, g)
        # state += mean(g², over the row); rows -= lr * g / (sqrt(state) + eps)
        gd = g.double()
        state = state + (gd ** 2).mean(dim=1, keepdim=True)
        rows = rows - lr * gd / (state.sqrt() + eps)
        assert torch.allclose(s.pull(0, x).double(), rows, atol=1e-6)
    assert torch.allclose(s.state[0][local_index(x, 1)].double(), state, atol=1e-6)


def test_adagrad_state_is_per_row():
    s = store(RowAdagrad(lr=1.0))
    s.push(0, ids(1), torch.full((1, 4), 3.0))
    before = s.pull(0, ids(2))
    s.push(0, ids(2), torch.full((1, 4), 1.0))
    # row 2's first step uses its own accumulator (1), not row 1's (9): a step of lr * 1 / 1
    assert torch.allclose(s.pull(0, ids(2)), before - 1.0, atol=1e-6)


@pytest.mark.parametrize("opt", [RowSGD(lr=0.2), RowAdagrad(lr=0.2)])
def test_lr_scale(opt):
    x, g = ids(3, 8), torch.randn(2, 4)
    full, scaled, half_lr = store(opt), store(opt), store(type(opt)(lr=0.1))
    scaled.push(0, x, g, lr_scale=0.5)
    half_lr.push(0, x, g)
    full.push(0, x, g)
    assert torch.allclose(scaled.pull(0, x), half_lr.pull(0, x), atol=1e-7)
    assert not torch.allclose(scaled.pull(0, x), full.pull(0, x))
    zero = store(opt)
    zero.push(0, x, g, lr_scale=0.0)
    assert torch.equal(zero.pull(0, x), initial_rows(11, 0, x, 4, 0.05))


def test_make_row_optimizer():
    assert make_row_optimizer("sgd", 0.3) == RowSGD(lr=0.3)
    assert make_row_optimizer("adagrad", 0.3, eps=1e-6) == RowAdagrad(lr=0.3, eps=1e-6)
    assert RowSGD(lr=1).state_dim == 0 and RowAdagrad(lr=1).state_dim == 1
    with pytest.raises(ValueError) as e:
        make_row_optimizer("adam", 0.1)
    assert "'adam'" in str(e.value)
    assert "adagrad" in str(e.value) and "sgd" in str(e.value)


# ------------------------------------------------------------------------------------ sharding

def test_shard_functions():
    x = ids(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    assert shard_of(x, 3).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]
    assert local_index(x, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3]
    # (shard, local index) identifies the id
    pairs = set(zip(shard_of(x, 3).tolist(), local_index(x, 3).tolist()))
    assert len(pairs) == len(x)


@pytest.mark.parametrize("rows, n", [(1, 1), (1, 4), (10, 3), (11, 3), (12, 3), (1000, 7)])
def test_rows_on_shard_sum_to_rows(rows, n):
    per = [rows_on_shard(rows, s, n) for s in range(n)]
    assert sum(per) == rows
    assert max(per) - min(per) <= 1
    # every local index of an owned id fits the shard's table
    every = torch.arange(rows)
    for s in range(n):
        owned = every[shard_of(every, n) == s]
        assert len(owned) == per[s]
        if len(owned):
            assert local_index(owned, n).max().item() == per[s] - 1


def test_split_by_shard_positions_restore_order():
    x = ids(17, 3, 3, 8, 0, 21, 5, 9)
    positions = split_by_shard(x, 4)
    assert len(positions) == 4
    assert sorted(torch.cat(positions).tolist()) == list(range(len(x)))
    for s, pos in enumerate(positions):
        assert (shard_of(x[pos], 4) == s).all()
    # results computed per shard, written back to the positions, line up with the input
    out = torch.empty_like(x)
    for pos in positions:
        out[pos] = x[pos] * 10
    assert torch.equal(out, x * 10)
    assert [p.tolist() for p in split_by_shard(ids(), 2)] == [[], []]


# ------------------------------------------------------------------------------------ lookup

def test_dedup():
    sparse = torch.tensor([[5, 1], [2, 1], [5, 0]])
    plan = LookupPlan.single_hot([TableSpec("a", 6, 2), TableSpec("b", 6, 2)])
    (u0, inv0), (u1, inv1) = plan.dedup(sparse)
    assert u0.tolist() == [2, 5] and inv0.tolist() == [1, 0, 1]
    assert u1.tolist() == [0, 1] and inv1.tolist() == [1, 1, 0]


def test_local_lookup_matches_nn_embedding():
    """Ids used twice in a batch get the sum of both gradients, exactly as nn.Embedding."""
    tables = [TableSpec("a", 6, 3), TableSpec("b", 4, 3)]
    lr = 0.5
    s = EmbeddingStore(tables, RowSGD(lr=lr), seed=2, init_scale=0.3)
    lookup = LocalLookup(s)
    ref = [nn.Embedding(t.rows, t.dim) for t in tables]
    for t, (emb, spec) in enumerate(zip(ref, tables)):
        with torch.no_grad():
            emb.weight.copy_(initial_rows(2, t, torch.arange(spec.rows), spec.dim, 0.3))
    sparse = torch.tensor([[1, 3], [4, 3], [1, 0], [1, 2]])  # id 1 thrice in a, 3 twice in b
    w = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, -1.1]])

    def loss_fn(a, b):  # a tiny model with an interaction between the two tables
        return ((a * w[0]).sum(1) * (b * w[1]).sum(1) + (a * b).sum(1) ** 2).sum()

    pulled = lookup.pull(sparse)
    assert [i.tolist() for i in pulled.ids] == [[1, 4], [0, 2, 3]]
    embs = pulled.embeddings().stacked
    assert embs.shape == (4, 2, 3)
    ref_embs = [emb(sparse[:, t]) for t, emb in enumerate(ref)]
    for t, r in enumerate(ref_embs):
        assert torch.equal(embs[:, t], r)
    loss_fn(embs[:, 0], embs[:, 1]).backward()
    loss_fn(*ref_embs).backward()
    grads = pulled.row_grads()
    assert [g.shape for g in grads] == [(2, 3), (3, 3)]
    for ids_t, g, emb in zip(pulled.ids, grads, ref):
        # the id used three times gets the sum of its three contributions, as in nn.Embedding
        assert torch.allclose(g, emb.weight.grad[ids_t], atol=1e-6)
        # rows no sample used got no gradient in the reference either
        unused = sorted(set(range(emb.num_embeddings)) - set(ids_t.tolist()))
        assert (emb.weight.grad[unused] == 0).all()
    lookup.push(pulled)
    for t, emb in enumerate(ref):
        every = torch.arange(emb.num_embeddings)
        expected = emb.weight.detach() - lr * emb.weight.grad
        assert torch.allclose(s.pull(t, every), expected, atol=1e-6)


def test_gradient_of_a_repeated_id_is_the_sum():
    s = EmbeddingStore([TableSpec("a", 10, 2), TableSpec("b", 10, 2)], RowSGD(lr=1.0), seed=0,
                       init_scale=0.1)
    lookup = LocalLookup(s)
    sparse = torch.tensor([[7, 7], [3, 1], [7, 7]])  # the same ids in table b: separate rows
    pulled = lookup.pull(sparse)
    e = pulled.embeddings().stacked
    coef = torch.tensor([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    (e[:, 0] * coef).sum().backward()   # only table a enters the loss
    grads = [dict(zip(i.tolist(), g.tolist())) for i, g in zip(pulled.ids, pulled.row_grads())]
    assert grads[0] == {3: [10.0, 20.0], 7: [101.0, 202.0]}
    assert grads[1] == {1: [0.0, 0.0], 7: [0.0, 0.0]}
    before = [s.pull(0, ids(3, 7)), s.pull(1, ids(1, 7))]
    lookup.push(pulled)
    assert torch.allclose(s.pull(0, ids(3, 7)),
                          before[0] - torch.tensor([[10.0, 20.0], [101.0, 202.0]]))
    assert torch.equal(s.pull(1, ids(1, 7)), before[1])


def test_push_without_backward_changes_nothing():
    s = EmbeddingStore(TABLES[:2], RowSGD(lr=0.1), seed=0)
    lookup = LocalLookup(s)
    sparse = torch.tensor([[1, 2], [4, 5]])
    pulled = lookup.pull(sparse)
    before = [s.pull(t, sparse[:, t]) for t in range(2)]
    lookup.push(pulled)
    assert all(torch.equal(s.pull(t, sparse[:, t]), before[t]) for t in range(2))


def test_pulled_rows_are_detached_from_the_store():
    s = EmbeddingStore(TABLES[:2], RowSGD(lr=0.1), seed=0)
    pulled = LocalLookup(s).pull(torch.tensor([[1, 2], [4, 5]]))
    assert pulled.rows.is_leaf and pulled.rows.requires_grad
    kept = s.pull(0, ids(1, 4))
    with torch.no_grad():
        pulled.rows.add_(1.0)
    assert torch.equal(s.pull(0, ids(1, 4)), kept)


def test_fuse_offsets_and_mixed_dims():
    sparse = torch.tensor([[5, 3], [2, 9], [5, 0]])
    plan = LookupPlan.single_hot([TableSpec("a", 6, 2), TableSpec("b", 10, 2)])
    tables = plan.dedup(sparse)
    pulled = plan.fuse(sparse, tables, [torch.tensor([[1.0, 1.0], [2.0, 2.0]]),
                                        torch.tensor([[3.0, 3.0], [4.0, 4.0], [5.0, 5.0]])])
    assert pulled.start == [0, 2]  # table b's rows start at 2 in the one leaf
    assert pulled.embeddings().stacked[:, :, 0].tolist() == [[2.0, 4.0], [1.0, 5.0],
                                                             [2.0, 3.0]]
    # tables of different widths: one leaf per width, the slots side by side, nothing stacked
    lookup = LocalLookup(store())
    sparse = torch.tensor([[1, 2, 3], [1, 0, 3]])
    pulled = lookup.pull(sparse)
    assert [leaf.shape for leaf in pulled.leaves] == [(1, 3), (3, 4)]  # c's; a's and b's
    embs = pulled.embeddings()
    assert [e.shape for e in embs] == [(2, 4), (2, 4), (2, 3)] and embs.stacked is None
    for t, e in enumerate(embs):
        torch.testing.assert_close(e, lookup.store.pull(t, sparse[:, t]))
    sum(e.sum() for e in embs).backward()
    assert [g.tolist() for g in pulled.row_grads()[1]] == [[1.0] * 4] * 2  # b: ids 0 and 2


@pytest.mark.parametrize("shards", [1, 2, 3, 8])
def test_split_by_shard_gives_each_shards_positions_in_ascending_order(shards):
    ids = torch.randint(0, 1000, (257,), generator=torch.Generator().manual_seed(shards))
    for case in (ids, ids[:0]):
        got = split_by_shard(case, shards)
        want = [torch.nonzero(case % shards == s, as_tuple=True)[0] for s in range(shards)]
        assert len(got) == shards and all(torch.equal(g, w) for g, w in zip(got, want))
