"""Dynamic tables in an EmbeddingStore (embedding/dynamic_table.py): rows keyed by any int64
id, admission, eviction, ttl, and snapshots that hold each row with its id."""

import numpy as np
import pytest
import torch

from recsync.checkpoint.reshard import snapshot_for
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import DynamicSpec, TableSpec
from recsync.embedding.store import EmbeddingStore, initial_rows

DIM = 4


def store(capacity=64, admit_after=1, eviction="lfu", ttl=0, shard=0, num_shards=1, lr=0.1):
    spec = TableSpec("d", 2, DIM, dynamic=DynamicSpec(capacity, admit_after, eviction, ttl))
    return EmbeddingStore([spec], make_row_optimizer("adagrad", lr), seed=5, shard=shard,
                          num_shards=num_shards)


def ids(*values):
    return torch.tensor(values, dtype=torch.int64)


def grads(n, value=1.0):
    return torch.full((n, DIM), value)


def test_a_row_starts_at_the_initial_values_a_fixed_table_gives_and_trains_the_same():
    """Without evictions a dynamic table is the fixed table of the same ids, to the bit."""
    fixed = EmbeddingStore([TableSpec("d", 100, DIM)], make_row_optimizer("adagrad", 0.1),
                           seed=5)
    dyn = store(capacity=128)
    rng = np.random.default_rng(0)
    for _ in range(20):
        batch = torch.from_numpy(np.unique(rng.integers(0, 100, 12)))
        assert torch.equal(fixed.pull(0, batch), dyn.pull(0, batch))
        g = torch.from_numpy(rng.standard_normal((len(batch), DIM)).astype(np.float32))
        fixed.push(0, batch, g)
        dyn.push(0, batch, g)
    every = torch.arange(100)
    assert torch.equal(fixed.pull(0, every), dyn.pull(0, every))


def test_any_int64_id_has_a_row_of_its_own_and_zero_is_the_missing_value_row():
    s = store()
    big = ids(0, -1, 2**63 - 2, -(2**40), 2**62 + 7, 1)
    rows = s.pull(0, big)
    expected = initial_rows(5, 0, big, DIM, 0.05)
    assert torch.equal(rows, expected)
    assert len({tuple(r.tolist()) for r in rows}) == len(big)  # no two ids share a row
    s.push(0, big, grads(len(big)))
    assert not torch.equal(s.pull(0, big), expected)
    assert s.dynamic_stats()["d"]["live"] == len(big)


def test_an_id_reads_zeros_and_drops_its_gradients_until_seen_admit_after_times():
    s = store(admit_after=3)
    x = ids(42)
    for _ in range(2):
        assert torch.equal(s.pull(0, x), torch.zeros(1, DIM))
        s.push(0, x, grads(1))  # dropped: no row yet
    row = s.pull(0, x)  # third sighting: admitted, at its initial value (nothing applied)
    assert torch.equal(row, initial_rows(5, 0, x, DIM, 0.05))
    stats = s.dynamic_stats()["d"]
    assert (stats["refused"], stats["admitted"], stats["dropped_grads"]) == (2, 1, 2)


def test_a_full_table_evicts_the_least_frequently_seen_rows():
    s = store(capacity=4, eviction="lfu")
    s.pull(0, ids(1, 2, 3, 4))
    for _ in range(3):
        s.pull(0, ids(1, 2, 4))  # 3 is the least often seen
    s.push(0, ids(1, 2, 3, 4), grads(4))
    trained_2 = s.pull(0, ids(2))
    s.pull(0, ids(9))  # needs a row: 3 goes
    stats = s.dynamic_stats()["d"]
    assert (stats["live"], stats["evicted"]) == (4, 1)
    assert torch.equal(s.pull(0, ids(2)), trained_2)  # kept
    # 3 comes back as a new row, at its initial value: what it had learnt went with it
    assert torch.equal(s.pull(0, ids(3)), initial_rows(5, 0, ids(3), DIM, 0.05))


def test_lru_evicts_the_row_unseen_for_longest():
    s = store(capacity=3, eviction="lru")
    for i in (1, 2, 3):
        s.pull(0, ids(i))
        s.push(0, ids(i), grads(1))  # the clock advances with each push
    for _ in range(5):
        s.pull(0, ids(1))  # 1 is the most often seen, but not the most recent
        s.push(0, ids(1), grads(1))
    s.pull(0, ids(3))
    s.push(0, ids(3), grads(1))
    s.pull(0, ids(7))  # 2 is the longest unseen
    live = set(s.snapshot()["t0.ids"].tolist())
    assert live == {1, 3, 7}


def test_rows_a_batch_pulls_are_kept_when_its_new_ids_need_room():
    s = store(capacity=4)
    s.pull(0, ids(1, 2, 3, 4))
    for _ in range(3):
        s.pull(0, ids(1, 2, 3, 4))
    s.push(0, ids(1, 2, 3, 4), grads(4))
    rows = s.pull(0, ids(1, 5))  # room for 5: not 1, which this pull reads
    assert not torch.equal(rows[0], torch.zeros(DIM)) and not torch.equal(rows[1], torch.zeros(DIM))
    assert 1 in s.snapshot()["t0.ids"].tolist()


def test_ttl_expires_rows_idle_for_that_many_updates_at_a_snapshot():
    s = store(ttl=3)
    s.pull(0, ids(1, 2))
    for _ in range(4):
        s.pull(0, ids(1))
        s.push(0, ids(1), grads(1))
    snap = s.snapshot()  # 2 was last seen 4 updates ago
    assert snap["t0.ids"].tolist() == [1]
    assert s.dynamic_stats()["d"]["expired"] == 1


def test_snapshot_and_restore_give_back_rows_ids_scores_and_clock():
    s = store(capacity=8, eviction="lfu")
    batch = ids(-5, 0, 17, 2**40)
    for k in range(3):
        s.pull(0, batch[: k + 2])
        s.push(0, batch[: k + 2], grads(k + 2, 0.5))
    snap = s.snapshot()
    back = store(capacity=8, eviction="lfu")
    back.restore(snap)
    assert torch.equal(back.pull(0, batch), s.pull(0, batch))
    assert back.dynamic[0].clock == s.dynamic[0].clock == 3
    # scores came back: the least seen row (2**40) is the one that makes room
    for b in (back, s):
        b.pull(0, ids(*range(100, 104)))
        b.pull(0, ids(200))
    assert set(back.snapshot()["t0.ids"].tolist()) == set(s.snapshot()["t0.ids"].tolist())


def test_restore_refuses_a_snapshot_of_the_other_kind_of_table():
    fixed = EmbeddingStore([TableSpec("d", 10, DIM)], make_row_optimizer("adagrad", 0.1))
    fixed.pull(0, ids(1, 2, 3))
    with pytest.raises(ValueError, match="no ids"):
        store().restore(fixed.snapshot())
    dyn = store()
    dyn.pull(0, ids(1, 2, 3))
    with pytest.raises(ValueError, match="taken of a dynamic table"):
        EmbeddingStore([TableSpec("d", 10, DIM)], make_row_optimizer("adagrad", 0.1)
                       ).restore(dyn.snapshot())


def test_more_rows_than_capacity_keep_the_best_scored_or_are_refused_without_scores():
    full = store(capacity=8)
    full.pull(0, ids(*range(1, 9)))
    full.pull(0, ids(2, 4, 6, 8))  # seen twice: these stay
    snap = full.snapshot()
    small = store(capacity=4)
    small.restore(snap)  # a resume onto fewer shards
    assert sorted(small.snapshot()["t0.ids"].tolist()) == [2, 4, 6, 8]
    assert small.dynamic_stats()["d"]["evicted"] == 4
    without_scores = {k: v for k, v in snap.items() if k not in ("t0.counts", "t0.last")}
    with pytest.raises(ValueError, match="capacity 4"):  # a model directory's rows
        store(capacity=4).restore(without_scores)


def test_a_background_copy_holds_rows_and_ids_as_they_were_while_pushes_and_evictions_go_on():
    s = store(capacity=16, eviction="lfu")
    rng = np.random.default_rng(1)
    for _ in range(10):
        b = torch.from_numpy(np.unique(rng.integers(1, 30, 10)))
        s.pull(0, b)
        s.push(0, b, torch.from_numpy(rng.standard_normal((len(b), DIM)).astype(np.float32)))
    before = s.snapshot()
    copy = s.begin_copy()
    for _ in range(10):  # new ids evict old rows and reuse their slots; pushes change rows
        b = torch.from_numpy(np.unique(rng.integers(100, 140, 10)))
        s.pull(0, b)
        s.push(0, b, grads(len(b)))
    during = copy.run()
    assert s.dynamic_stats()["d"]["evicted"] > 0
    order_b, order_d = np.argsort(before["t0.ids"]), np.argsort(during["t0.ids"])
    for key in ("ids", "weights", "state", "counts", "last"):
        assert np.array_equal(before[f"t0.{key}"][order_b], during[f"t0.{key}"][order_d]), key


def test_resharding_moves_each_row_with_its_id():
    old = [store(shard=k, num_shards=2) for k in range(2)]
    every = ids(*range(-20, 20))
    for k, s in enumerate(old):
        mine = every[every % 2 == k]
        s.pull(0, mine)
        s.push(0, mine, grads(len(mine), 0.3))
    snaps = []
    for s in old:
        arrays = s.snapshot()
        meta = {"tables": 1, "version": 0, "mode": "async", "pulls": 0, "pushes": 0,
                "samples_applied": 0, "staleness": {}, "dense_optimizer": None, "rule": {}}
        snaps.append((arrays, meta))
    new = [store(shard=k, num_shards=3) for k in range(3)]
    for k, s in enumerate(new):
        arrays, _ = snapshot_for(iter(snaps), 2, k, 3, ({}, {}), "async")
        s.restore(arrays)
        mine = every[every % 3 == k]
        owner = [old[int(i) % 2] for i in mine]
        expected = torch.stack([o.pull(0, i.view(1))[0] for o, i in zip(owner, mine)])
        assert torch.equal(s.pull(0, mine), expected)


def test_an_evaluation_pull_admits_evicts_and_scores_nothing():
    s = store(capacity=4, admit_after=2)
    for _ in range(2):
        s.pull(0, ids(1, 2, 3, 4))
    s.push(0, ids(1, 2, 3, 4), grads(4))
    before, stats = s.snapshot(), dict(s.dynamic_stats()["d"])
    rows = s.pull(0, ids(1, 9, 10), admit=False)  # 9 and 10 have no row: zeros, nothing else
    assert torch.equal(rows[1:], torch.zeros(2, DIM)) and not torch.equal(rows[0], rows[1])
    after = s.snapshot()
    for key in ("ids", "weights", "state", "counts", "last"):
        assert np.array_equal(before[f"t0.{key}"], after[f"t0.{key}"]), key
    assert s.dynamic_stats()["d"] == stats
    assert torch.equal(s.pull(0, ids(9)), torch.zeros(1, DIM))  # its first sighting: not 2


def test_one_steps_pulls_do_not_evict_the_rows_another_pull_of_it_admitted():
    """Sync: two workers pull, then both push; the second pull must not take the first's new
    rows (their gradients would be dropped)."""
    s = store(capacity=4)
    s.pull(0, ids(1, 2, 3, 4))
    s.push(0, ids(1, 2, 3, 4), grads(4))
    first = s.pull(0, ids(10, 11))  # evicts two of 1-4
    s.pull(0, ids(12, 13))  # 10 and 11 were read since the last update: not theirs to take
    assert torch.equal(s.pull(0, ids(10, 11), admit=False), first)
    s.push(0, ids(10, 11), grads(2))
    assert s.dynamic_stats()["d"]["dropped_grads"] == 0


def test_ttl_expires_idle_rows_as_training_goes_without_a_checkpoint():
    s = store(ttl=4)
    s.pull(0, ids(1, 2))
    for _ in range(8):
        s.pull(0, ids(1))
        s.push(0, ids(1), grads(1))
    stats = s.dynamic_stats()["d"]
    assert (stats["live"], stats["expired"]) == (1, 1)


def test_the_clock_near_the_top_of_uint32_shifts_back_with_every_rows_age_kept():
    from recsync.embedding.dynamic_table import CLOCK_SHIFT_AT
    s = store(capacity=3, eviction="lru", ttl=5)
    table = s.dynamic[0]
    table.clock = table.expired_at = CLOCK_SHIFT_AT - 3  # as if after 2**31 - 3 updates
    for i in (1, 2, 3):
        s.pull(0, ids(i))
        s.push(0, ids(i), grads(1))  # the third push reaches the top: the clock shifts
    assert table.clock == CLOCK_SHIFT_AT // 2
    assert table.map.last_seen(table.map.find([1, 2, 3])).tolist() == [
        CLOCK_SHIFT_AT // 2 - 3, CLOCK_SHIFT_AT // 2 - 2, CLOCK_SHIFT_AT // 2 - 1]
    s.pull(0, ids(7))  # LRU still knows 1 as the longest unseen
    assert set(s.snapshot()["t0.ids"].tolist()) == {2, 3, 7}
