"""The arithmetic of recoveries (recsync/distributed/recovery_math.py), the run's tallies
(recsync/distributed/tallies.py) and the counts of a checkpoint round that does not pause,
without Ray.

Run: python -m pytest -q tests/unit/test_recovery_math.py"""

from __future__ import annotations

import pytest

from recsync.distributed.checkpoints import completed_counts
from recsync.distributed.recovery_math import (lost_work_s, partial_loss, rebuild_point,
                                               training_rate)
from recsync.distributed.tallies import RunTallies


def test_a_rebuilt_group_starts_at_the_step_some_shard_completed_and_the_others_skip_it():
    assert rebuild_point([7, 6, 7], {6: {}, 7: {}}) == (7, [1], True)
    assert rebuild_point([7, 7], [6, 7]) == (7, [], True)
    point = rebuild_point([9, 9], [6, 7])
    assert point.step == 9 and not point.known  # the replica cannot start there


def test_a_partial_recovery_loses_the_updates_since_its_checkpoint_never_fewer_than_none():
    assert partial_loss(34, 30, 8) == (4, 32)
    assert partial_loss(30, 34, 8) == (0, 0)


def test_the_training_rate_is_over_the_polls_up_to_the_failure():
    recent = [(10.0, 0), (11.0, 100), (12.0, 300), (20.0, 9_999)]
    assert training_rate(recent, 12.0) == 150.0
    assert training_rate(recent, 10.5) == 0.0  # one poll: no rate
    assert training_rate([(5.0, 1), (5.0, 9)], 6.0) == 0.0  # no time between them


def test_lost_work_is_priced_at_the_rate_else_by_the_time_since_the_checkpoint_or_resume():
    assert lost_work_s(300, 150.0, failed_unix=50.0, checkpoint_unix=40.0,
                       resumed_unix=0.0) == 2.0
    assert lost_work_s(300, 0.0, 50.0, 40.0, 0.0) == 10.0
    assert lost_work_s(300, 0.0, 50.0, 40.0, 45.0) == 5.0  # since the later rollback
    assert lost_work_s(300, 0.0, 50.0, 60.0, 0.0) == 0.0


def test_tallies_keep_each_ranks_counts_over_its_processes():
    t = RunTallies(2)
    assert t.polled(0, 80, 10) == {"samples": 80, "steps": 10}
    t.retired(0, {"samples": 96, "steps": 12})  # its last counts, read as it went
    assert t.done_before[0] == {"samples": 96, "steps": 12} and t.last[0]["samples"] == 0
    assert t.polled(0, 8, 1) == {"samples": 104, "steps": 13}
    # a dead process: the chunks the queue saw its rank complete count too
    assert t.dead_counts(0, completed=96 + 24, batch_size=8) == {"samples": 24, "steps": 3}
    t.took(1, ["c"])
    t.rolled_back([{"samples": 5, "steps": 1}, {"samples": 0, "steps": 0}])
    assert t.last == [{"samples": 0, "steps": 0}] * 2 and t.taken == [[], ["c"]]


def test_the_clock_starts_once_counting_earlier_runs_and_a_rollback_restarts_the_rate():
    t = RunTallies(1)
    t.provisional_start(30.0, now=100.0)
    assert t.start_unix == 70.0 and not t.clock_started
    assert t.start_clock(30.0, now=130.0) and t.start_unix == 100.0
    assert not t.start_clock(0.0, now=500.0) and t.start_unix == 100.0
    t.observe(1.0, 0)
    t.observe(2.0, 50)
    assert t.rate_before(2.0) == 50.0
    t.resumed(9.0)
    assert t.resumed_unix == 9.0 and t.rate_before(10.0) == 0.0


@pytest.mark.parametrize("completed, expected", [
    ({"0": {"samples": 64}}, [{"samples": 64, "steps": 8}, {"samples": 0, "steps": 0}]),
    ({}, [{"samples": 0, "steps": 0}, {"samples": 0, "steps": 0}])])
def test_a_round_without_a_pause_counts_completed_chunks_only(completed, expected):
    """Rank 0 has 80 samples in 10 steps (batch 8); what the queue has not seen completed
    (16 samples, 2 steps; or all of it) is in a chunk still leased, trained again after a
    rollback."""
    counts = [{"samples": 80, "steps": 10}, {"samples": 0, "steps": 0}]
    assert completed_counts(counts, completed, batch_size=8) == expected
