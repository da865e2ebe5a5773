"""A call's tables at once: the row rule fused over a push's tables, a pull of every table of
one row width in one gather from their one storage (embedding/store.py, row_optim.py); each the
same as one table at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsync.embedding.row_optim import RowAdagrad, RowSGD
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore


def ids(*values):
    return torch.tensor(values, dtype=torch.int64)


@pytest.mark.parametrize("opt", [RowSGD(lr=0.3), RowAdagrad(lr=0.3)])
def test_apply_to_table_equals_gather_apply_scatter(opt):
    gen = torch.Generator().manual_seed(3)
    weights, state = torch.randn(20, 4, generator=gen), torch.rand(20, opt.state_dim,
                                                                  generator=gen)
    local = ids(7, 0, 19, 4)
    grads = torch.randn(4, 4, generator=gen)
    w2, s2 = weights.clone(), state.clone()
    opt.apply_to_table(weights, state, local, grads, lr_scale=0.7)
    rows, row_state = w2[local], s2[local]
    opt.apply(rows, row_state, grads, lr_scale=0.7)
    w2[local], s2[local] = rows, row_state
    assert torch.allclose(weights, w2, atol=1e-6)
    assert torch.allclose(state, s2, atol=1e-6)
    untouched = [i for i in range(20) if i not in local.tolist()]
    assert torch.equal(weights[untouched], w2[untouched])


@pytest.mark.parametrize("fused_rows", [16_384, 4])  # 4: a width's rows in chunks
@pytest.mark.parametrize("opt", [RowSGD(lr=0.3, weight_decay=0.01),
                                 RowAdagrad(lr=0.3, weight_decay=0.01)])
def test_a_push_of_all_tables_at_once_equals_one_push_per_table(opt, fused_rows, monkeypatch):
    """push_tables (a shard's push: the tables of one row width updated together in their one
    storage) leaves every table as a push per table does, with tables of two widths, an empty
    one, rows touched for the first time and a checkpoint copy in progress (the rows it still
    needs saved first)."""
    import recsync.embedding.row_optim as row_optim
    monkeypatch.setattr(row_optim, "FUSED_ROWS", fused_rows)
    tables = [TableSpec("a", 30, 4), TableSpec("b", 20, 8), TableSpec("c", 25, 4),
              TableSpec("d", 10, 4), TableSpec("e", 12, 4)]
    fused, one_by_one = (EmbeddingStore(tables, opt, seed=5, shard=1, num_shards=2)
                         for _ in range(2))
    gen = torch.Generator().manual_seed(4)
    for store in (fused, one_by_one):  # some rows touched before, some not
        store.pull(0, ids(1, 3, 5))
    copy = fused.begin_copy()
    before = fused.snapshot(checkpoint=False)
    for step in range(3):
        push_ids = [ids(1, 3, 7, 29), ids(5, 9, 11), ids(3, 23), ids(), ids(1)]
        grads = [torch.randn(len(i), t.dim, generator=gen) for i, t in zip(push_ids, tables)]
        fused.push_tables(push_ids, grads, lr_scale=0.5)
        for t, (i, g) in enumerate(zip(push_ids, grads)):
            if len(i):
                one_by_one.push(t, i, g, lr_scale=0.5)
    for t in range(len(tables)):
        held = fused.initialized[t]  # (rows never touched hold no value yet)
        assert torch.equal(held, one_by_one.initialized[t])
        assert torch.allclose(fused.weights[t][held], one_by_one.weights[t][held], atol=1e-6)
        assert torch.allclose(fused.state[t][held], one_by_one.state[t][held], atol=1e-6)
    copied = copy.run()  # the copy holds the rows as they were when it began
    fused.copying = None
    for key, value in before.items():
        assert (copied[key] == value).all(), key


@pytest.mark.parametrize("shard,shards", [(0, 1), (1, 3)])
def test_a_pull_of_all_tables_at_once_equals_one_pull_per_table(shard, shards):
    """pull_tables / pull_arrays (one gather per row width over the tables' one storage) give
    each table the rows a pull of that table alone gives, with two widths, a dynamic table
    between fixed ones, an empty table, repeated ids, first touches and read-only ids (as Ray
    hands them over); the rows are copies."""
    from recsync.embedding.spec import DynamicSpec
    tables = [TableSpec("a", 30, 4), TableSpec("b", 20, 8),
              TableSpec("d", 2, 4, dynamic=DynamicSpec(16, 1, "lfu", 0)), TableSpec("c", 25, 4),
              TableSpec("e", 12, 4)]
    fused, one_by_one = (EmbeddingStore(tables, RowAdagrad(lr=0.1), seed=5, shard=shard,
                                        num_shards=shards) for _ in range(2))
    owned = [torch.arange(t.rows)[torch.arange(t.rows) % shards == shard] for t in tables]
    for store in (fused, one_by_one):
        store.pull(0, owned[0][:3])  # some rows touched before
    pull_ids = [owned[0][[0, 2, 5, 2]], owned[1][[1, 4]], ids(7, 10**12, 7), ids(),
                owned[4][[3, 0]]]
    arrays = [i.numpy().copy() for i in pull_ids]
    for a in arrays:
        a.setflags(write=False)
    got = fused.pull_arrays(arrays)
    for t, i in enumerate(pull_ids):
        want = one_by_one.pull(t, i) if len(i) else torch.empty(0, tables[t].dim)
        assert got[t].dtype == np.float32 and got[t].shape == tuple(want.shape), t
        assert np.array_equal(got[t], want.numpy()), t
    for t in range(len(tables)):
        assert torch.equal(fused.initialized[t], one_by_one.initialized[t]), t
    again = fused.pull_tables(pull_ids)
    got[0][:] = 9.0  # a copy: writing it changes neither the store nor a later pull
    assert torch.equal(again[0], fused.pull(0, pull_ids[0])) and not (again[0] == 9.0).any()


def test_a_call_of_all_tables_refuses_an_id_outside_its_table():
    """An id beyond its table must not read, nor write, the next table's rows of the shared
    storage: a pull and a push are refused whole, naming the table."""
    s = EmbeddingStore([TableSpec("a", 10, 4), TableSpec("b", 10, 4)], RowSGD(lr=0.1))
    with pytest.raises(IndexError, match="table 0"):
        s.pull_arrays([np.array([3, 10]), np.array([1])])
    with pytest.raises(IndexError, match="table 1"):
        s.pull_arrays([np.array([3]), np.array([-1])])
    before = s.pull_arrays([np.arange(10), np.arange(10)])
    with pytest.raises(IndexError, match="table 0"):
        s.push_tables([ids(2, 10), ids(0)], [torch.ones(2, 4), torch.ones(1, 4)])
    after = s.pull_arrays([np.arange(10), np.arange(10)])
    assert all((a == b).all() for a, b in zip(before, after))
