"""CPR's partial checkpoints (MFU, SSU) of dynamic tables (issue 33): rows chosen by slot and
saved by id, the ids evicted or expired since the previous checkpoint saved as tombstones, a
slot's usage forgotten when another id gets it, and a chain restored by id (partial recovery,
a standby taking over, a resume onto other shards), within the table's capacity."""

import numpy as np
import pytest
import torch

from cores import push, test_core
from recsync.checkpoint import files
from recsync.checkpoint.priority import MostUsed, SampledRows
from recsync.checkpoint.reshard import resolve_chain, snapshot_for
from recsync.embedding.dynamic_table import keys_of
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import DynamicSpec, TableSpec

DIM = 4


def core(priority=None, capacity=16, eviction="lfu", ttl=0, full_every=100):
    tables = [TableSpec("d", 2, DIM, dynamic=DynamicSpec(capacity, 1, eviction, ttl)),
              TableSpec("f", 40, DIM)]
    return test_core(tables, make_row_optimizer("adagrad", 0.1), shard=0, num_shards=1,
                     seed=3, priority=priority, full_every=full_every)


def mfu(fraction=1.0, capacity=16):
    return MostUsed([capacity, 40], fraction)


def step(c, ids, fixed=(), value=1.0, sampled=True):
    """A worker's step on ``c``: a pull (admitting new ids) and a push of gradient ``value``
    to every row it pulled."""
    ids = [np.unique(np.asarray(ids, np.int64)), np.unique(np.asarray(fixed, np.int64))]
    c.pull(ids)
    grads = [np.full((len(i), DIM), value, np.float32) for i in ids]
    marks = [np.full(len(i), sampled) for i in ids]
    push(c, ids, grads, None, c.version, sampled=marks)


def held(c, table=0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """A dynamic table's live rows by id: (weights, state)."""
    state = c.store.dynamic[table].ids_state()
    slots = torch.from_numpy(state["slots"])
    weights = c.store.weights[table].index_select(0, slots).numpy()
    opt = c.store.state[table].index_select(0, slots).numpy()
    return {int(i): (w, s) for i, w, s in zip(state["ids"], weights, opt)}


def assert_same_rows(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key][0], b[key][0], err_msg=str(key))
        np.testing.assert_array_equal(a[key][1], b[key][1], err_msg=str(key))


def slot_of(c, i: int) -> int:
    return int(c.store.dynamic[0].map.find(keys_of(torch.tensor([i])))[0])


def test_a_partial_checkpoint_saves_rows_by_id_and_tombstones_the_evicted_ones():
    c = core(mfu(), capacity=4)
    for _ in range(3):
        step(c, [11, 12, 13, 14])
    step(c, [11, 12, 13])  # 14: the least frequently used
    base = c.snapshot()
    assert "t0.gone" not in base[0]  # a full checkpoint needs none
    step(c, [15])  # admitted in 14's place
    assert slot_of(c, 14) == -1 and slot_of(c, 15) >= 0
    arrays, meta = c.snapshot(partial=True)
    assert meta["partial"] == "mfu"
    assert arrays["t0.ids"].tolist() == [15] and arrays["t0.gone"].tolist() == [14]
    restored = core(mfu(), capacity=4)
    restored.restore_chain([base, (arrays, meta)])
    assert slot_of(restored, 14) == -1  # not brought back from the base
    assert_same_rows(held(restored), held(c))
    rows, _, _ = restored.pull([np.array([14]), np.array([], np.int64)], read_only=True)
    assert rows[0].tolist() == [[0.0] * DIM]  # no row: zeros, as an id never seen


def test_reading_the_rows_between_checkpoints_keeps_the_tombstones_and_expires_nothing():
    """An evaluation's or a model's reading (trained_rows) is not a checkpoint round: the next
    partial still tombstones what was evicted before it, and no idle row goes."""
    c = core(mfu(), capacity=4, ttl=1000)
    for _ in range(3):
        step(c, [11, 12, 13, 14])
    step(c, [11, 12, 13])
    base = c.snapshot()
    step(c, [15])  # evicts 14
    c.store.dynamic[0].spec = TableSpec("d", 2, DIM, dynamic=DynamicSpec(4, 1, "lfu", 1))
    c.trained_rows()  # with ttl 1 now, a checkpoint's expiry would remove the idle rows
    assert slot_of(c, 11) >= 0 and slot_of(c, 15) >= 0
    c.store.dynamic[0].spec = TableSpec("d", 2, DIM, dynamic=DynamicSpec(4, 1, "lfu", 1000))
    arrays, meta = c.snapshot(partial=True)
    assert arrays["t0.gone"].tolist() == [14]
    restored = core(mfu(), capacity=4)
    restored.restore_chain([base, (arrays, meta)])
    assert slot_of(restored, 14) == -1
    assert_same_rows(held(restored), held(c))


@pytest.mark.parametrize("kind", ["mfu", "ssu"])
def test_an_evicted_ids_usage_does_not_pass_to_the_id_that_gets_its_slot(kind):
    priority = mfu(capacity=4) if kind == "mfu" else SampledRows(2, max_rows=100)
    c = core(priority, capacity=4)
    for _ in range(5):
        step(c, [1, 2, 3])
    step(c, [4])
    slot = slot_of(c, 4)
    c.snapshot()  # a full one: counting starts again
    for _ in range(5):
        step(c, [4])  # 4 is used most since the save...
    for _ in range(7):
        step(c, [1, 2, 3])  # ...until 1, 2, 3 are pulled more and it is evicted
    step(c, [5], sampled=False)  # SSU: 5 was not in a sampled sample
    assert slot_of(c, 4) == -1 and slot_of(c, 5) == slot  # 5 took 4's slot
    if kind == "mfu":
        assert int(priority.counts[0][slot]) == 1  # 5's one push, not 4's six
    else:
        assert priority.recorded == 3  # 1, 2 and 3: 4's slot forgotten
    arrays, _ = c.snapshot(partial=True)
    assert arrays["t0.gone"].tolist() == [4] and 4 not in arrays["t0.ids"].tolist()
    assert (5 in arrays["t0.ids"].tolist()) == (kind == "mfu")


def test_ssu_records_only_the_sampled_slots_of_a_dynamic_table():
    ssu = SampledRows(2, max_rows=100)
    c = core(ssu)
    step(c, [7, 8], sampled=False)
    step(c, [9])
    c.snapshot()
    step(c, [7], sampled=False)
    step(c, [8])
    arrays, meta = c.snapshot(partial=True)
    assert meta["partial"] == "ssu" and arrays["t0.ids"].tolist() == [8]


@pytest.mark.parametrize("kind", ["mfu", "ssu"])
@pytest.mark.parametrize("eviction", ["lfu", "lru"])
def test_a_chain_with_evictions_between_checkpoints_restores_every_row_by_id(kind, eviction):
    """Every row used since the previous save is saved (MFU fraction 1, every sample sampled),
    so the restored shard holds exactly the rows the shard held, by id, whatever was evicted,
    re-admitted into other slots and trained between the checkpoints."""
    def priority():
        return mfu(1.0, capacity=24) if kind == "mfu" else SampledRows(2, max_rows=10_000)
    c = core(priority(), capacity=24, eviction=eviction)
    rng = np.random.default_rng(4)
    chain, evicted = [], 0
    for k in range(4):
        for _ in range(12):
            step(c, rng.integers(1, 60, 6), rng.integers(0, 40, 3), float(rng.normal()))
        chain.append(c.snapshot(partial=k > 0))
        stats = c.store.dynamic_stats()["d"]
        assert stats["evicted"] > evicted  # evictions between every two checkpoints
        evicted = stats["evicted"]
        restored = core(priority(), capacity=24, eviction=eviction)
        restored.restore_chain(chain)
        assert_same_rows(held(restored), held(c))
        assert torch.equal(restored.store.weights[1][restored.store.initialized[1]],
                           c.store.weights[1][c.store.initialized[1]])
        assert restored.store.dynamic[0].clock == c.store.dynamic[0].clock
    gone = np.concatenate([a["t0.gone"] for a, _ in chain[1:]])
    assert len(gone) and not np.isin(gone, list(held(c))).all()  # some stayed gone
    resolved, meta = resolve_chain(chain)  # a resume resolves the chain alike
    assert meta["partial"] is None and "t0.gone" not in resolved
    assert sorted(resolved["t0.ids"].tolist()) == sorted(held(c))


def test_ttl_expiry_is_a_tombstone_too():
    c = core(mfu(), ttl=4)
    step(c, [1, 2])
    base = c.snapshot()
    for _ in range(5):
        step(c, [2])  # 1 idle for more than 4 updates: expired
    partial = c.snapshot(partial=True)
    assert partial[0]["t0.gone"].tolist() == [1]
    restored = core(mfu(), ttl=4)
    restored.restore_chain([base, partial])
    assert sorted(held(restored)) == [2]


def test_a_partial_checkpoint_is_the_state_it_began_at_while_pushes_and_evictions_go_on():
    c = core(mfu(), capacity=16)
    rng = np.random.default_rng(2)
    for _ in range(10):
        step(c, rng.integers(1, 30, 8), value=float(rng.normal()))
    base = c.snapshot()
    for _ in range(10):
        step(c, rng.integers(1, 40, 8), value=float(rng.normal()))
    expected = held(c)
    evicted = c.store.dynamic_stats()["d"]["evicted"]
    copy, arrays, meta = c.begin_snapshot(partial=True)
    for _ in range(10):  # new ids evict rows the copy has not reached and take their slots
        step(c, rng.integers(100, 140, 8), value=float(rng.normal()))
    assert c.store.dynamic_stats()["d"]["evicted"] > evicted
    arrays.update(copy.run())
    c.end_snapshot(copy, meta)
    restored = core(mfu(), capacity=16)
    restored.restore_chain([base, (arrays, meta)])
    assert_same_rows(held(restored), expected)
    after = c.snapshot(partial=True)  # the evictions during the copy: the next one's tombstones
    restored.restore_chain([base, (arrays, meta), after])
    assert_same_rows(held(restored), held(c))


def test_a_chain_holding_more_ids_than_the_capacity_keeps_the_best_scored():
    c = core(mfu(capacity=32), capacity=32)
    for _ in range(3):
        step(c, range(1, 11))  # 1..10 pulled three times
    step(c, range(11, 31))  # 11..30 once
    base = c.snapshot()
    small = core(mfu(capacity=12), capacity=12)
    small.restore_chain([base])
    kept = set(held(small))
    assert len(kept) == 12 and kept > set(range(1, 11))  # the most pulled, then any 2
    assert small.store.dynamic_stats()["d"]["evicted"] == 18
    step(small, [1])
    arrays, _ = small.snapshot(partial=True)
    assert sorted(arrays["t0.gone"].tolist()) == sorted(set(range(1, 31)) - kept)


def test_files_and_a_fresh_shard_take_the_chain_as_a_standby_or_a_restart_would(tmp_path):
    c = core(mfu(0.5), capacity=8)
    rng = np.random.default_rng(7)
    for k in range(3):
        for _ in range(8):
            step(c, rng.integers(1, 30, 4))
        arrays, meta = c.snapshot(partial=k > 0)
        if k:
            meta["base"] = 1
        files.write(tmp_path, k + 1, arrays, meta)
    chain = files.latest_chain(tmp_path)  # meta_check.check_rows reads the tombstones too
    assert [ck.meta["partial"] for ck in chain] == [None, "mfu", "mfu"]
    fresh = core(mfu(0.5), capacity=8)
    fresh.restore_chain([(ck.arrays, ck.meta) for ck in chain])
    expected = {}
    for ck in chain:  # by hand: each save overwrites, each tombstone removes
        for i in ck.arrays.get("t0.gone", []):
            expected.pop(int(i), None)
        for n, i in enumerate(ck.arrays["t0.ids"]):
            expected[int(i)] = (ck.arrays["t0.weights"][n], ck.arrays["t0.state"][n])
    assert_same_rows(held(fresh), expected)
    assert set(held(fresh)) <= set(held(c))  # nothing the shard had evicted
    resharded = [snapshot_for(iter([resolve_chain([(ck.arrays, ck.meta) for ck in chain])]),
                              1, k, 2, ({}, {}), "async")[0] for k in range(2)]
    assert sorted(np.concatenate([r["t0.ids"] for r in resharded]).tolist()) \
        == sorted(expected)
    bad = dict(chain[-1].arrays, **{"t0.gone": np.zeros((2, 2), np.int64)})
    with pytest.raises(ValueError, match="t0.gone"):
        files.meta_check.check_rows(bad, chain[-1].meta, "here")
