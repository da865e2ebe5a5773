"""Checkpoint interval selection against hand computations."""

import math

import pytest

from recsync.checkpoint.interval import (choose, expected_pls, full_overhead, partial_interval,
                                         partial_overhead, young_interval)


def test_young_interval_and_the_overheads_by_hand():
    assert young_interval(2.0, 400.0) == pytest.approx(40.0)  # sqrt(2 * 2 * 400)
    assert full_overhead(40.0, 2.0, 400.0) == pytest.approx(2 / 40 + 40 / 800)
    assert full_overhead(40.0, 2.0, 400.0, recovery_s=8.0) == pytest.approx(0.1 + 8 / 400)
    assert partial_interval(400.0, 4, 0.01) == pytest.approx(32.0)  # 2 * 400 * 4 * 0.01
    assert expected_pls(32.0, 400.0, 4) == pytest.approx(0.01)
    assert partial_overhead(32.0, 2.0, 400.0) == pytest.approx(2 / 32)


def test_young_interval_minimizes_full_recoverys_overhead():
    best = young_interval(3.0, 900.0)
    for t in (best * 0.5, best * 0.9, best * 1.1, best * 2):
        assert full_overhead(t, 3.0, 900.0) > full_overhead(best, 3.0, 900.0)


def test_partial_is_chosen_when_its_overhead_is_lower():
    d = choose(save_cost_s=2.0, mtbf_s=400.0, shards=4, pls_target=0.01)
    assert d.kind == "partial" and d.interval_s == pytest.approx(32.0)
    assert d.expected_overhead == pytest.approx(0.0625) and d.full_overhead == pytest.approx(0.1)
    assert d.expected_pls == pytest.approx(0.01)
    assert "partial chosen" in d.text() and "MTBF 400 s" in d.text()


def test_full_is_chosen_when_the_pls_target_forces_tiny_partial_intervals():
    d = choose(save_cost_s=0.01, mtbf_s=1000.0, shards=1, pls_target=1e-5)
    assert d.kind == "full" and d.interval_s == pytest.approx(math.sqrt(20.0))
    assert d.partial_interval_s == pytest.approx(0.02) and d.partial_overhead == pytest.approx(0.5)
    assert d.expected_pls == 0.0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="MTBF > 0"):
        choose(save_cost_s=1.0, mtbf_s=0.0, shards=2, pls_target=0.01)
