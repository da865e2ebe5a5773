"""Admission (embedding/admission.py): a count-min sketch admits an id after admit_after
sightings, never before unless hashes collide, in memory fixed however many ids go by.
Run: pytest -q tests/unit/test_admission.py"""

from __future__ import annotations

import numpy as np
import pytest

from recsync.embedding.admission import COUNTER_MAX, Admission

I64 = np.iinfo(np.int64)


def collision_free(adm: Admission, ids: np.ndarray) -> bool:
    """No two ids share a counter in any row: the sketch then counts each id exactly."""
    cells = adm._cells(ids)
    return all(len(np.unique(row)) == len(ids) for row in cells)


def test_admit_after_1_or_less_admits_everything_and_holds_no_memory():
    for n in (0, 1):
        adm = Admission(n)
        assert adm.nbytes == 0
        assert adm.admit(np.arange(1, 6)).all()
        assert (adm.num_admitted, adm.num_refused) == (5, 0)


@pytest.mark.parametrize("admit_after", [2, 3, 7])
def test_an_id_is_admitted_at_exactly_admit_after_sightings_and_never_before(admit_after):
    rng = np.random.default_rng(admit_after)
    ids = rng.integers(I64.min, I64.max, 60, dtype=np.int64)
    adm = Admission(admit_after, width=1 << 16, depth=3, seed=5)
    assert collision_free(adm, ids)
    seen = np.zeros(len(ids), dtype=np.int64)
    for _ in range(40):
        pick = rng.random(len(ids)) < 0.4
        admitted = adm.admit(ids[pick])
        seen[pick] += 1
        np.testing.assert_array_equal(admitted, seen[pick] >= admit_after)
        np.testing.assert_array_equal(adm.estimate(ids), np.minimum(seen, COUNTER_MAX))
    total = seen.sum()
    assert adm.num_admitted == np.maximum(seen - admit_after + 1, 0).sum()
    assert adm.num_admitted + adm.num_refused == total


def test_estimates_never_undercount_and_beat_a_plain_count_min_when_ids_collide():
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 2**40, 3000)
    adm = Admission(50, width=256, depth=2)  # far more ids than counters: many collisions
    truth = np.zeros(len(ids), dtype=np.int64)
    plain = np.zeros(2 * 256, dtype=np.int64)  # count-min adding 1 to every counter
    for _ in range(30):
        pick = np.unique(rng.choice(len(ids), 400))
        adm.admit(ids[pick])
        truth[pick] += 1
        np.add.at(plain, adm._cells(ids[pick]).reshape(-1), 1)
        estimate = adm.estimate(ids)
        assert (estimate >= truth).all()
        assert (estimate <= plain[adm._cells(ids)].min(axis=0)).all()
    assert (adm.estimate(ids) > truth).any(), "no collision happened: the test proves nothing"


def test_an_id_whose_counters_all_collide_is_overestimated_and_admitted_early():
    """The documented price of bounded memory: with one counter, every id shares it."""
    adm = Admission(3, width=1, depth=1)
    assert not adm.admit([11]).any() and not adm.admit([12]).any()
    assert adm.admit([13]).all(), "13 seen once, admitted on the sightings of 11 and 12"


def test_memory_stays_fixed_however_many_ids_go_by():
    adm = Admission(4, width=1 << 12, depth=4)
    assert adm.nbytes == 2 * 4 * (1 << 12)
    rng = np.random.default_rng(0)
    for _ in range(50):
        adm.admit(rng.integers(I64.min, I64.max, 4000, dtype=np.int64))
    assert adm.nbytes == 2 * 4 * (1 << 12)


def test_decay_halves_counts_by_hand_and_every_decay_every_sightings():
    ids = np.arange(1, 11)
    adm = Admission(100, width=1 << 12, depth=2)
    assert collision_free(adm, ids)
    for _ in range(9):
        adm.admit(ids)
    adm.decay()
    np.testing.assert_array_equal(adm.estimate(ids), 4)
    auto = Admission(100, width=1 << 12, depth=2, decay_every=30)
    for _ in range(3):  # 30 sightings: halved after the third call
        auto.admit(ids)
    np.testing.assert_array_equal(auto.estimate(ids), 1)
    auto.admit(ids)
    np.testing.assert_array_equal(auto.estimate(ids), 2)


def test_counters_saturate_instead_of_wrapping():
    adm = Admission(COUNTER_MAX, width=64, depth=2)
    state = adm.state()
    state["counters"][:] = COUNTER_MAX - 1
    adm.load(state)
    assert adm.admit([5]).all()
    assert adm.admit([5]).all()
    assert adm.estimate([5])[0] == COUNTER_MAX


def test_an_id_listed_twice_in_one_call_counts_once():
    adm = Admission(3, width=1 << 10)
    assert not adm.admit([9, 9]).any()
    assert adm.estimate([9])[0] == 1


def test_uint64_ids_count_as_the_same_bits_in_int64():
    adm = Admission(2, width=1 << 10)
    adm.admit(np.array([2**64 - 1], dtype=np.uint64))
    assert adm.admit(np.array([-1])).all()


def test_state_round_trip_continues_the_count():
    ids = np.arange(1, 20) * 1_000_003
    adm = Admission(3, width=1 << 10, depth=3, seed=2)
    adm.admit(ids)
    adm.admit(ids[:5])
    other = Admission(3, width=1 << 10, depth=3, seed=2)
    other.load(adm.state())
    assert (other.num_admitted, other.num_refused) == (adm.num_admitted, adm.num_refused)
    np.testing.assert_array_equal(other.admit(ids), np.arange(len(ids)) < 5)


@pytest.mark.parametrize("other, message", [
    (dict(admit_after=4), r"\(admit_after, width, depth, seed\) = \[3, 1024, 3, 2\]"),
    (dict(width=512), "this one has"),
    (dict(seed=1), "this one has"),
])
def test_load_refuses_the_state_of_another_sketch(other, message):
    state = Admission(3, width=1 << 10, depth=3, seed=2).state()
    kwargs = dict(admit_after=3, width=1 << 10, depth=3, seed=2) | other
    adm = Admission(**kwargs)
    with pytest.raises(ValueError, match=message):
        adm.load(state)


def test_load_refuses_bad_counters_and_tallies():
    adm = Admission(3, width=16, depth=2)
    state = adm.state()
    with pytest.raises(ValueError, match=r"uint16 of shape \(32,\)"):
        adm.load(state | {"counters": state["counters"].astype(np.int32)})
    with pytest.raises(ValueError, match="tallies"):
        adm.load(state | {"tallies": np.array([1, -1, 0])})
    with pytest.raises(ValueError, match="lacks"):
        adm.load({"counters": state["counters"]})


@pytest.mark.parametrize("kwargs, message", [
    (dict(admit_after=COUNTER_MAX + 1), "admit_after must be"),
    (dict(admit_after=2, width=0), "width must be"),
    (dict(admit_after=2, depth=0), "depth must be"),
    (dict(admit_after=2, decay_every=-1), "decay_every must be"),
])
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Admission(**kwargs)
