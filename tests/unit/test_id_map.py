"""IdMap (embedding/id_map.py, bucket_index.py) against a Python dict oracle: seeded random runs
of inserts, finds, removals and reinserts, with ids that collide in the hash index.
Run: pytest -q tests/unit/test_id_map.py"""

from __future__ import annotations

import numpy as np
import pytest

from recsync.embedding.bucket_index import BUCKET, EMPTY, TOMB, _first_true
from recsync.embedding.id_map import COUNT_MAX, LAST_FREE, IdMap, MapFullError

I64 = np.iinfo(np.int64)


class Oracle:
    """What the map must hold: id -> slot, plus every id ever seen (to probe absent ones)."""

    def __init__(self):
        self.slot_of: dict[int, int] = {}
        self.seen: set[int] = {0}
        self.count: dict[int, int] = {}  # by slot, like last
        self.last: dict[int, int] = {}

    def check(self, m: IdMap) -> None:
        seen = np.fromiter(self.seen, dtype=np.int64)
        want = np.array([self.slot_of.get(int(i), -1) for i in seen], dtype=np.int64)
        np.testing.assert_array_equal(m.find(seen), want)
        assert len(m) == len(self.slot_of) and m.free() == m.capacity - len(self.slot_of)
        live = m.live_slots()
        assert sorted(self.slot_of.values()) == live.tolist()
        assert set(m.ids_of(live).tolist()) == set(self.slot_of)
        assert m.counts(live).tolist() == [self.count[s] for s in live.tolist()]
        assert m.last_seen(live).tolist() == [self.last[s] for s in live.tolist()]
        assert m._index.num_tombs == np.count_nonzero(m._index.table == TOMB)


def id_pool(rng: np.random.Generator, m: IdMap, size: int) -> np.ndarray:
    """Unique nonzero ids: extremes, small and negative ones, random 64-bit patterns, and a
    third of them sharing a few home buckets, so buckets overflow and probes run on."""
    special = np.array([1, -1, I64.max, I64.min, I64.min + 1, 2**32, -(2**32), 7 << 40])
    small = rng.integers(-500, 500, size // 3)
    wide = rng.integers(I64.min, I64.max, size * 4, dtype=np.int64, endpoint=True)
    buckets, _ = m._index._home(wide)
    crowded = wide[np.isin(buckets, buckets[:3])][: size // 3]
    ids = np.unique(np.concatenate([special, small, crowded, wide[: size // 3]]))
    return rng.permutation(ids[ids != 0])


def random_step(rng, m: IdMap, oracle: Oracle, pool: np.ndarray, now: int) -> None:
    op = rng.choice(["insert", "insert", "fill", "remove", "find", "touch", "find_touch",
                     "overfill"])
    absent = np.array([i for i in pool if int(i) not in oracle.slot_of], dtype=np.int64)
    if op in ("insert", "fill") and len(absent):
        n = m.free() if op == "fill" else int(rng.integers(1, 40))
        ids = rng.choice(absent, min(len(absent), m.free(), n), replace=False)
        slots = m.insert(ids, now=now)
        assert len(set(slots.tolist())) == len(ids)
        assert not set(slots.tolist()) & set(oracle.slot_of.values()), "a live slot was reused"
        assert ((0 <= slots) & (slots < m.capacity)).all()
        oracle.slot_of.update(zip(ids.tolist(), slots.tolist()))
        oracle.seen.update(ids.tolist())
        oracle.count.update(dict.fromkeys(slots.tolist(), 0))
        oracle.last.update(dict.fromkeys(slots.tolist(), now))
    elif op == "touch" and oracle.slot_of:
        live = np.fromiter(oracle.slot_of.values(), dtype=np.int64)
        touched = rng.choice(live, int(rng.integers(1, 30)))  # with repeats
        m.touch(touched, now=now)
        for s in touched.tolist():
            oracle.count[s] += 1
            oracle.last[s] = now
    elif op == "find_touch":  # a pull's steady state: find, and touch what is found
        probe = rng.choice(np.fromiter(oracle.seen, dtype=np.int64), 48)  # duplicates, id 0
        probe = np.concatenate([probe, rng.integers(I64.min, I64.max, 8, dtype=np.int64)])
        missing = I64.max if I64.max in oracle.slot_of else 5  # what id 0 is looked up as
        want = np.array([oracle.slot_of.get(int(i) if i else missing, -1) for i in probe])
        slots, absent = m.find_touch(probe, now, missing)
        np.testing.assert_array_equal(slots, want)
        assert absent == np.count_nonzero(want < 0)
        for s in slots[slots >= 0].tolist():
            oracle.count[s] += 1
            oracle.last[s] = now
    elif op == "remove" and oracle.slot_of:
        live = np.fromiter(oracle.slot_of.values(), dtype=np.int64)
        gone = rng.choice(live, int(rng.integers(1, len(live) + 1)), replace=False)
        gone_ids = m.ids_of(gone)
        m.remove(gone)
        for i in gone_ids.tolist():
            del oracle.slot_of[i]
    elif op == "find":
        probe = rng.choice(np.fromiter(oracle.seen, dtype=np.int64), 64)  # duplicates
        probe = np.concatenate([probe, rng.integers(I64.min, I64.max, 8, dtype=np.int64)])
        want = [oracle.slot_of.get(int(i), -1) for i in probe]
        np.testing.assert_array_equal(m.find(probe), want)
    elif op == "overfill" and len(absent) > m.free():
        before = (m.find(pool).copy(), len(m), m.state())
        with pytest.raises(MapFullError, match=rf"{m.free() + 1} ids.*{m.free()} free"):
            m.insert(absent[: m.free() + 1], now=now)
        assert len(m) == before[1]
        np.testing.assert_array_equal(m.find(pool), before[0])
        for key, arr in m.state().items():
            np.testing.assert_array_equal(arr, before[2][key])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("capacity", [1, 13, 200, 1500])
def test_the_map_agrees_with_a_dict_after_every_operation(seed, capacity):
    rng = np.random.default_rng(seed)
    m, oracle = IdMap(capacity), Oracle()
    pool = id_pool(rng, m, 3 * capacity + 10)
    most_tombs, times_full = 0, 0
    for step in range(400):
        random_step(rng, m, oracle, pool, now=step)
        oracle.check(m)
        most_tombs = max(most_tombs, m._index.num_tombs)
        times_full += m.free() == 0
    assert times_full, "the run never filled the map"
    if capacity >= 200:
        assert most_tombs > 0, "the run never removed from a full bucket"


def test_filling_to_capacity_then_emptying_and_refilling_reuses_every_slot():
    m = IdMap(64)
    ids = np.arange(-32, 33)
    ids = ids[ids != 0]
    slots = m.insert(ids)
    assert m.free() == 0 and sorted(slots.tolist()) == list(range(64))
    with pytest.raises(MapFullError, match="1 ids asked for 1 slots, 0 free"):
        m.insert([99])
    m.remove(slots)
    assert len(m) == 0 and (m.find(ids) == -1).all()
    again = m.insert(ids[::-1] * 1000)
    assert sorted(again.tolist()) == list(range(64))
    np.testing.assert_array_equal(m.find(ids[::-1] * 1000), again)


def test_tombstones_pile_up_only_to_a_rebuild_and_finds_stay_right():
    m = IdMap(512)
    rng = np.random.default_rng(1)
    wide = rng.integers(I64.min, I64.max, 40_000, dtype=np.int64)
    buckets, _ = m._index._home(wide)
    # 500 ids whose home is one of 4 buckets: ~63 buckets all full, probes run far past home
    crowded = np.unique(wide[buckets < 4])[:500]
    slots = m.insert(crowded)
    assert not (m._index.table[:60] == EMPTY).any()
    tombs, rebuilds = [], 0
    for gone in np.split(rng.permutation(slots), 10):
        before = m._index.num_tombs
        m.remove(gone)
        tombs.append(m._index.num_tombs)
        rebuilds += m._index.num_tombs < before
        assert m._index.num_tombs <= m._index.max_tombs
        kept = m.live_slots()
        np.testing.assert_array_equal(m.find(m.ids_of(kept)), kept)
        assert (m.find(crowded[np.isin(slots, gone)]) == -1).all()
    assert max(tombs) > 100 and rebuilds, f"tombstones {tombs}: never rebuilt"
    again = m.insert(crowded)
    np.testing.assert_array_equal(m.find(crowded), again)


def test_structured_ids_spread_over_the_buckets_like_random_ones():
    m = IdMap(1 << 16)
    for ids in (np.arange(1, 30_001), np.arange(1, 30_001) << 40,
                np.arange(1, 30_001) * (1 << 32) + 5, -np.arange(1, 30_001)):
        buckets, _ = m._index._home(ids)
        load = np.bincount(buckets, minlength=m._index.num_buckets)
        # 30k ids in 16k buckets: Poisson(1.8) makes >= 12 in one bucket very unlikely
        assert load.max() < 12, f"ids {ids[:3]}... pile up: {load.max()} in one bucket"


def test_uint64_ids_are_the_same_64_bits_as_int64():
    m = IdMap(8)
    big = np.array([2**64 - 1, 2**63, 5], dtype=np.uint64)
    slots = m.insert(big)
    np.testing.assert_array_equal(m.find(np.array([-1, I64.min, 5])), slots)
    np.testing.assert_array_equal(m.ids_of(slots), [-1, I64.min, 5])


def test_insert_refuses_id_0_and_with_check_duplicates_and_present_ids():
    m = IdMap(16)
    m.insert([3, 4])
    with pytest.raises(ValueError, match="id 0"):
        m.insert([5, 0])
    with pytest.raises(ValueError, match="unique"):
        m.insert([6, 6], check=True)
    with pytest.raises(ValueError, match="1 ids already present, e.g. 4"):
        m.insert([7, 4], check=True)
    assert len(m) == 2 and (m.find([0, 5, 6, 7]) == -1).all()
    assert m.insert(np.empty(0, dtype=np.int64)).shape == (0,)


def test_remove_refuses_free_repeated_and_out_of_range_slots_and_changes_nothing():
    m = IdMap(16)
    slots = m.insert([10, 20, 30])
    for bad, msg in (([slots[0], slots[0]], "unique"), ([slots[1], 9], "slot 9 is free"),
                     ([16], r"in \[0, 16\)"), ([-1], r"in \[0, 16\)")):
        with pytest.raises(ValueError, match=msg):
            m.remove(bad)
        np.testing.assert_array_equal(m.find([10, 20, 30]), slots)
    with pytest.raises(ValueError, match=r"in \[0, 16\)"):
        m.ids_of([-1])


def test_touch_counts_each_listing_and_saturates():
    m = IdMap(8)
    s = m.insert([1, 2, 3], now=5)
    m.touch([s[0], s[0], s[1], s[0]], now=9)
    np.testing.assert_array_equal(m.counts(s), [3, 1, 0])
    np.testing.assert_array_equal(m.last_seen(s), [9, 9, 5])
    state = m.state()
    state["counts"] = np.array([COUNT_MAX - 1, COUNT_MAX, 7])
    m.load(state)
    m.touch([s[0], s[0], s[0], s[1], s[2]], now=10)
    np.testing.assert_array_equal(m.counts(s), [COUNT_MAX, COUNT_MAX, 8])


def test_find_touch_counts_each_listing_saturates_and_looks_up_id_0_as_the_missing_key():
    m = IdMap(8)
    s = m.insert([1, 2, I64.max], now=5)
    slots, absent = m.find_touch(np.array([1, 0, 1, 4, 0, 2]), 9, I64.max)
    np.testing.assert_array_equal(slots, [s[0], s[2], s[0], -1, s[2], s[1]])
    assert absent == 1
    np.testing.assert_array_equal(m.counts(s), [2, 1, 2])
    np.testing.assert_array_equal(m.last_seen(s), [9, 9, 9])
    assert m.find_touch(np.array([0]), 9)[0].tolist() == [-1]  # missing_key 0: no row
    state = m.state()
    state["counts"] = np.array([COUNT_MAX - 1, COUNT_MAX, 7])
    m.load(state)
    m.find_touch(np.array([1, 1, 1, 2]), 10, I64.max)
    np.testing.assert_array_equal(m.counts(s), [COUNT_MAX, COUNT_MAX, 7])
    with pytest.raises(ValueError, match="now must be"):
        m.find_touch(np.array([1]), LAST_FREE, I64.max)


def oracle_lowest(m: IdMap, k: int, policy: str) -> list[int]:
    live = m.live_slots()
    rows = [(int(c), int(t), int(s)) if policy == "lfu" else (int(t), int(c), int(s))
            for s, c, t in zip(live, m.counts(live), m.last_seen(live))]
    return [r[2] for r in sorted(rows)][: max(k, 0)]


@pytest.mark.parametrize("seed", range(4))
def test_lowest_and_idle_match_a_sorted_oracle(seed):
    rng = np.random.default_rng(seed)
    m = IdMap(300)
    ids = rng.choice(np.arange(1, 10_000), 250, replace=False)
    m.insert(ids[:200], now=0)
    for now in range(1, 30):
        live = m.live_slots()
        # few distinct counts and times: many ties, broken as documented
        m.touch(rng.choice(live, int(rng.integers(1, 60))), now=int(rng.integers(0, 6)))
        if now % 7 == 0:
            m.remove(rng.choice(live, 20, replace=False))
            absent = [i for i in ids if m.find([i])[0] < 0]
            m.insert(rng.choice(absent, 15, replace=False), now=now)
    for policy in ("lfu", "lru"):
        for k in (0, 1, 5, 37, len(m) - 1, len(m), len(m) + 10):
            assert m.lowest(k, policy).tolist() == oracle_lowest(m, k, policy), (policy, k)
    for before in (0, 1, 3, 6, 100):
        want = [s for s in m.live_slots() if m.last_seen([s])[0] < before]
        assert m.idle(before).tolist() == want
    with pytest.raises(ValueError, match="policy must be one of"):
        m.lowest(3, "fifo")


def test_lowest_is_exact_when_its_sample_misjudges_the_bound():
    """lowest guesses a score bound from every (capacity // 4096)-th slot: here those slots
    are the only never-touched ones, so the guess is too low for large k and too high for
    nothing; both must still give the exact answer."""
    m = IdMap(1 << 14)
    slots = m.insert(np.arange(1, (1 << 14) - 99))  # 99 free slots at the end
    off_sample = slots[slots % 4 != 0]
    m.touch(np.repeat(off_sample, 2), now=3)
    for k in (100, 4000, 5000, 9000):
        for policy in ("lfu", "lru"):
            assert m.lowest(k, policy).tolist() == oracle_lowest(m, k, policy), (k, policy)


def test_now_may_not_reach_the_value_that_marks_free_slots_nor_be_negative():
    m = IdMap(4)
    with pytest.raises(ValueError, match="now must be in"):
        m.insert([1], now=LAST_FREE)
    with pytest.raises(ValueError, match="now must be in"):
        m.insert([1], now=-1)
    s = m.insert([1], now=LAST_FREE - 1)
    with pytest.raises(ValueError, match="now must be in"):
        m.touch(s, now=LAST_FREE)
    assert m.idle(LAST_FREE).tolist() == s.tolist() and m.idle(2**70).tolist() == s.tolist()
    assert m.idle(-5).tolist() == [] and m.last_seen(s).tolist() == [LAST_FREE - 1]


def test_shift_time_moves_every_live_rows_last_back_and_none_below_0():
    m = IdMap(8)
    s = m.insert([1, 2, 3], now=10)
    m.touch(s[1:], now=100)
    m.touch(s[2:], now=2**32 - 2)
    m.remove(s[:1])
    m.shift_time(50)
    np.testing.assert_array_equal(m.last_seen(s[1:]), [50, 2**32 - 52])
    m.shift_time(60)
    np.testing.assert_array_equal(m.last_seen(s[1:]), [0, 2**32 - 112])
    assert m.idle(LAST_FREE).tolist() == s[1:].tolist()  # the free slot stays free
    with pytest.raises(ValueError, match="by must be >= 0"):
        m.shift_time(-1)


def test_state_and_load_round_trip_keeps_slots_ids_counts_and_free_slots():
    rng = np.random.default_rng(3)
    m = IdMap(100)
    ids = rng.integers(I64.min, I64.max, 80, dtype=np.int64)
    slots = m.insert(ids, now=4)
    m.remove(slots[::3])
    m.touch(slots[1::3], now=8)
    state = m.state()
    assert list(state) == ["slots", "ids", "counts", "last"]
    assert (np.diff(state["slots"]) > 0).all()
    other = IdMap(100)
    other.insert([123456789], now=1)  # load starts from empty
    other.load(state)
    np.testing.assert_array_equal(other.find(ids), m.find(ids))
    assert other.find([123456789])[0] == -1 and len(other) == len(m)
    for key in state:
        np.testing.assert_array_equal(other.state()[key], state[key])
    new = other.insert(np.arange(1, other.free() + 1))
    assert not set(new.tolist()) & set(state["slots"].tolist())


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(slots=s["slots"] + 100), r"slots must be in \[0, 100\)"),
    (lambda s: s["slots"].__setitem__(1, s["slots"][0]), "duplicate slots"),
    (lambda s: s["ids"].__setitem__(1, s["ids"][0]), "duplicate ids"),
    (lambda s: s["ids"].__setitem__(2, 0), "id 0"),
    (lambda s: s.update(last=s["last"][:-1]), "lengths differ"),
    (lambda s: s.pop("counts"), r"lacks \['counts'\]"),
    (lambda s: s.update(counts=s["counts"].astype(np.int64) - 1), "counts must be in"),
    (lambda s: s["last"].__setitem__(0, LAST_FREE), "marks a free slot"),
    (lambda s: s["last"].__setitem__(0, -3), r"last must be in \[0"),
])
def test_load_names_the_problem_in_bad_state_and_changes_nothing(change, message):
    m = IdMap(100)
    ids = np.arange(1, 11) * 7
    m.insert(ids, now=2)
    state = m.state()
    change(state)
    with pytest.raises(ValueError, match=message):
        m.load(state)
    np.testing.assert_array_equal(m.find(ids), np.arange(10))


def test_metadata_is_at_most_32_bytes_per_row_and_independent_of_load():
    assert IdMap.bytes_per_row(1 << 20) <= 32
    m = IdMap(1 << 16)
    empty = m.nbytes
    m.insert(np.arange(1, 1 << 15))
    assert m.nbytes == empty <= 32 * (1 << 16)
    assert m._index.table.shape[1] == BUCKET


def test_first_true_agrees_with_argmax_on_every_bucket_pattern():
    patterns = (np.arange(1, 256)[:, None] >> np.arange(8)) & 1 == 1
    np.testing.assert_array_equal(_first_true(patterns), patterns.argmax(axis=1))
