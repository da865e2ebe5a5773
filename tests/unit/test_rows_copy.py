"""A checkpoint's rows copied on a thread while pushes go on (embedding/rows_copy.py): the copy
is the store as it was when the copy began."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from recsync.embedding import rows_copy
from recsync.embedding.row_optim import RowAdagrad
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore

TABLES = [TableSpec("a", 4000, 8), TableSpec("b", 300, 4)]


def trained_store(seed: int = 0) -> EmbeddingStore:
    store = EmbeddingStore(TABLES, RowAdagrad(lr=0.1), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for t, spec in enumerate(TABLES):
        ids = torch.unique(torch.randint(0, spec.rows // 2, (spec.rows // 3,), generator=gen))
        store.push(t, ids, torch.randn(len(ids), spec.dim, generator=gen))
    return store


def push_everywhere(store: EmbeddingStore, step: int) -> None:
    """Change rows touched before and rows never touched before, in every table."""
    gen = torch.Generator().manual_seed(100 + step)
    for t, spec in enumerate(TABLES):
        ids = torch.unique(torch.randint(0, spec.rows, (spec.rows // 4,), generator=gen))
        store.push(t, ids, torch.randn(len(ids), spec.dim, generator=gen))


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_copy_is_the_store_when_it_began_whatever_is_pushed_before_it_runs():
    store = trained_store()
    expected = store.snapshot()
    copy = store.begin_copy()
    push_everywhere(store, 0)
    push_everywhere(store, 1)
    assert copy.saved_early > 0
    assert_same(copy.run(), expected)
    assert store.copying is None
    assert not all(np.array_equal(v, store.snapshot()[k]) for k, v in expected.items())


def test_a_copy_on_a_thread_with_pushes_meanwhile_is_the_store_when_it_began(monkeypatch):
    monkeypatch.setattr(rows_copy, "SLICE_ROWS", 7)  # many slices, so pushes land between
    store = trained_store(1)
    expected = store.snapshot()
    copy = store.begin_copy()
    out = {}
    thread = threading.Thread(target=lambda: out.update(copy.run()))
    thread.start()
    for step in range(20):
        push_everywhere(store, step)
    thread.join()
    assert_same(out, expected)


def test_a_copy_of_chosen_rows_keeps_only_those_that_were_touched():
    store = trained_store(2)
    rows = [torch.arange(0, 4000, 3), torch.arange(0, 300, 2)]
    full = store.snapshot()
    copy = store.begin_copy(rows)
    push_everywhere(store, 0)
    got = copy.run()
    for t, chosen in enumerate(rows):
        keep = np.isin(full[f"t{t}.local"], chosen.numpy())
        np.testing.assert_array_equal(got[f"t{t}.local"], full[f"t{t}.local"][keep])
        np.testing.assert_array_equal(got[f"t{t}.weights"], full[f"t{t}.weights"][keep])
        np.testing.assert_array_equal(got[f"t{t}.state"], full[f"t{t}.state"][keep])
    assert copy.rows == sum(len(got[f"t{t}.local"]) for t in range(len(TABLES)))


def test_a_restored_copy_gives_the_store_back_and_nothing_restores_during_a_copy():
    store = trained_store(3)
    copy = store.begin_copy()
    with pytest.raises(RuntimeError, match="already in progress"):
        store.begin_copy()
    with pytest.raises(RuntimeError, match="while a copy"):
        store.restore(store.snapshot())
    push_everywhere(store, 0)
    saved = copy.run()
    other = EmbeddingStore(TABLES, RowAdagrad(lr=0.1), seed=3)
    other.restore(saved)
    again = trained_store(3)
    for t, spec in enumerate(TABLES):
        ids = torch.arange(spec.rows)
        torch.testing.assert_close(other.pull(t, ids), again.pull(t, ids), rtol=0, atol=0)


def test_a_copy_whose_rows_are_chosen_on_its_thread_holds_the_chosen_rows_as_they_began():
    """CPR: the priority's choice runs in ``run``; pushes before it save any touched row, and
    only the chosen ones are kept."""
    store = trained_store(4)
    expected = store.snapshot()
    chosen = [torch.arange(0, 2000, 5), torch.arange(0, 150, 7)]
    copy = store.begin_copy(choose=lambda: chosen)
    push_everywhere(store, 0)  # before the choice: every touched row is kept as it was
    got = copy.run()
    assert copy.chosen is chosen and copy.saved_early > 0
    for t, rows in enumerate(chosen):
        keep = np.isin(expected[f"t{t}.local"], rows.numpy())
        for part in ("local", "weights", "state"):
            np.testing.assert_array_equal(got[f"t{t}.{part}"], expected[f"t{t}.{part}"][keep])
    assert copy.rows == sum(int(np.isin(expected[f"t{t}.local"], r.numpy()).sum())
                            for t, r in enumerate(chosen))
