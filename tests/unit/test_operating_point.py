"""Scenario recovery: its operating point (bench/operating_point.py, against hand computations),
the pilot's rate and the split of a standby failure's downtime."""

import pytest

from recsync.bench.operating_point import failure_schedule, full_overhead_at, run_length_for


def test_full_recovery_overhead_at_a_run_length():
    # T = 300 s, 3 failures: M = 100 s, Young's I = sqrt(2 x 0.02 x 100) = 2 s; each failure
    # 4 s down + 1 s redone, 150 saves of 0.02 s: (15 + 3) / 300
    assert full_overhead_at(300.0, 3, 0.02, 4.0) == pytest.approx(0.06)


def test_the_run_length_that_makes_full_recovery_cost_the_target():
    assert run_length_for(0.06, 3, 0.02, 4.0) == pytest.approx(300.0, rel=1e-6)
    longer = run_length_for(0.03, 3, 0.02, 4.0)  # a smaller share needs a longer run
    assert longer > 300 and full_overhead_at(longer, 3, 0.02, 4.0) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="at any run length"):
        run_length_for(0.001, 3, 10.0, 4.0)


def test_the_schedule_has_exactly_the_failures_asked_for_in_the_window():
    seed, mean, kills = failure_schedule(300.0, 6.0, 3, 4, first_s=12.0, window=0.85,
                                         min_gap_s=10.0)
    assert mean == 100.0 and len(kills) == 3
    times = [k["at_s"] for k in kills]
    assert times[0] >= 12.0 and times[-1] <= 6.0 + 0.85 * 300
    assert all(b - a >= 10.0 for a, b in zip(times, times[1:]))
    assert all(k["target"] == "ps" and 0 <= k["index"] < 4 for k in kills)
    assert failure_schedule(300.0, 6.0, 3, 4, 12.0, 0.85, 10.0) == (seed, mean, kills)


def test_the_pilots_rate_is_measured_before_its_kill():
    from recsync.bench.recovery import rate_before
    metrics = [{"time_s": t, "samples": n} for t, n in
               [(0.5, 0), (1.0, 1000), (2.0, 3000), (4.0, 7000), (5.0, 2000), (6.0, 4000)]]
    # from the first record past the warm-up (1,000 samples) to the last before 4.5 s
    assert rate_before(metrics, 4.5, 1000) == (7000 - 1000) / (4.0 - 1.0)
    with pytest.raises(RuntimeError, match="too little"):
        rate_before(metrics, 1.5, 1000)


def test_a_standby_failures_downtime_is_split_at_the_ask_and_the_take_over():
    from recsync.bench.recovery import take_over_split
    rec = {"recoveries": [
        {"shard": 1, "standby": True, "downtime_to": "first pull served", "killed_s": 10.0,
         "downtime_s": 0.5},
        {"shard": 1, "standby": True, "downtime_to": "ready", "killed_s": 30.0,
         "downtime_s": 0.4},  # no pull served before the end: not split
        {"shard": 0, "standby": False, "downtime_to": "first pull served", "killed_s": 20.0,
         "downtime_s": 2.5}],
        "take_overs": [{"shard": 1, "asked_s": 10.1, "ready_s": 10.4},
                       {"shard": 1, "asked_s": 30.2, "ready_s": 30.3}]}
    ((detect, take_over, to_pull),) = take_over_split(rec)
    assert (detect, take_over, to_pull) == pytest.approx((0.1, 0.3, 0.1))


def test_work_redone_beyond_the_interval_is_priced_per_failure():
    # as above, with 1 s more redone per failure: (3 x (4 + 1 + 1) + 3) / 300
    assert full_overhead_at(300.0, 3, 0.02, 4.0, 1.0) == pytest.approx(0.07)
    assert run_length_for(0.07, 3, 0.02, 4.0, 1.0) == pytest.approx(300.0, rel=1e-6)


def test_the_pilots_redone_work_beyond_its_checkpoint():
    from recsync.bench.recovery import redo_beyond_interval
    metrics = [{"time_s": 8.5, "samples": 0, "events": [
        {"time_s": 8.2, "event": "checkpoint: shards' sequence numbers [4, 4], versions [9, 9], "
                                 "job checkpoint 5, training blocked 3 ms"},
        {"time_s": 6.1, "event": "checkpoint: ..., job checkpoint 4, training blocked 3 ms"}]}]
    # killed at 10.0 s, 1.8 s after job checkpoint 5: of 3.0 s redone, 1.2 s is beyond it
    rec = {"job_sequence": 5, "killed_s": 10.0, "lost_work_s": 3.0}
    assert redo_beyond_interval(metrics, rec) == pytest.approx(1.2)
    assert redo_beyond_interval(metrics, {**rec, "lost_work_s": 1.0}) == 0.0
    with pytest.raises(RuntimeError, match="no job checkpoint 7"):
        redo_beyond_interval(metrics, {**rec, "job_sequence": 7})
