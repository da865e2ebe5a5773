"""Scenario `ps`'s saturation curve without Ray: the efficiency arithmetic, the 90% figure on
curves of every shape, the measuring window, and the curve's part of the result with fake runs.

Run: python -m pytest tests/unit/test_bench_ps_saturation.py
"""

import json

import pytest

from recsync.bench import ps_saturation as sat


def test_efficiency_is_samples_per_s_over_n_times_one_workers():
    eff = sat.efficiencies({4: 3000.0, 1: 1000.0, 2: 1900.0})
    assert list(eff) == [1, 2, 4]
    assert eff == pytest.approx({1: 1.0, 2: 0.95, 4: 0.75})


def test_a_curve_without_one_worker_is_refused():
    with pytest.raises(ValueError, match="1 worker"):
        sat.efficiencies({2: 1900.0, 4: 3000.0})
    with pytest.raises(ValueError, match="1 worker"):
        sat.efficiencies({1: 0.0, 2: 1.0})


def test_the_90pct_figure_is_the_last_n_before_the_first_drop_under_it():
    eff = {1: 1.0, 2: 0.98, 4: 0.95, 8: 0.91, 12: 0.7}
    assert sat.workers_at(eff) == 8
    # linear between (8, 0.91) and (12, 0.7): 0.01 of the 0.21 drop past 8
    assert sat.workers_at_interpolated(eff) == pytest.approx(8 + 4 * 0.01 / 0.21)


def test_a_curve_that_holds_to_its_last_point_gives_that_point_and_no_crossing():
    eff = {1: 1.0, 2: 1.02, 4: 0.97, 8: 0.93, 12: 0.9}
    assert sat.workers_at(eff) == 12
    assert sat.workers_at_interpolated(eff) is None


def test_a_curve_under_90pct_from_two_workers_on_gives_one():
    eff = {1: 1.0, 2: 0.6, 4: 0.3, 8: 0.15, 12: 0.1}
    assert sat.workers_at(eff) == 1
    assert sat.workers_at_interpolated(eff) == pytest.approx(1 + 0.1 / 0.4)


def test_a_dip_under_90pct_counts_even_if_a_larger_n_comes_back_over_it():
    eff = {1: 1.0, 2: 0.95, 4: 0.88, 8: 0.92, 12: 0.5}
    assert sat.workers_at(eff) == 2
    assert sat.workers_at_interpolated(eff) == pytest.approx(2 + 2 * 0.05 / 0.07)


def test_efficiency_against_the_best_per_worker_speed_never_exceeds_one():
    # 2 workers are faster per worker than 1: they become the reference
    curve = {1: 1000.0, 2: 2200.0, 4: 3900.0}
    eff = sat.efficiencies_vs_best(curve)
    assert eff == pytest.approx({1: 1000 / 1100, 2: 1.0, 4: 3900 / 4400})
    assert sat.workers_at(eff) == 2
    assert sat.workers_at(sat.efficiencies(curve)) == 4  # against 1 worker: 0.975


def test_a_super_linear_point_is_over_the_target_like_any_other():
    eff = {1: 1.0, 2: 1.1, 4: 0.85}
    assert sat.workers_at(eff) == 2
    assert sat.workers_at_interpolated(eff) == pytest.approx(2 + 2 * 0.2 / 0.25)


def test_the_window_runs_from_the_first_poll_past_the_start_to_the_first_showing_the_end():
    # one step of 100 samples every 2 s, polls every 0.5 s
    metrics = [{"time_s": 0.5 * k, "samples": 100 * (k // 4)} for k in range(41)]
    r = sat.window_rate(metrics, 300, 800)
    # 300 first shown at 6.0 s, 800 first shown at 16.0 s (not at 17.5, the last poll with it)
    assert r["window_start_s"] == 6.0 and r["window_s"] == 10.0
    assert r["samples_per_s"] == pytest.approx(50.0)


def test_a_window_with_too_few_records_says_run_more_steps():
    with pytest.raises(RuntimeError, match="--scale"):
        sat.window_rate([{"time_s": 1.0, "samples": 0}, {"time_s": 2.0, "samples": 500}],
                        100, 400)


def test_step_times_are_medians_over_workers_and_polls_inside_the_window():
    metrics = [{"time_s": 1.0, "worker_step_s": [9.0], "worker_compute_s": [9.0]},
               {"time_s": 2.0, "worker_step_s": [1.0, None], "worker_compute_s": [0.5, None]},
               {"time_s": 3.0, "worker_step_s": [1.2, 1.4], "worker_compute_s": [0.7, 0.9]}]
    assert sat.window_step_times(metrics, 1.0, 3.0) == pytest.approx(
        {"step_s": 1.2, "compute_s": 0.7})


def fake_arm(n: int, samples_per_s: float) -> dict:
    return {"workers": n, "samples_per_s": samples_per_s,
            "window": {"step_s": 1.6, "compute_s": 1.2},
            "shard": {"busy_fraction": 0.1 * n, "cpu_ms_per_request": 20.0, "late_s": 0.0},
            "emulation_held": {"worker_pace": 1.0, "worker_worst_deviation": 0.01,
                               "shard_late_s": 0.0},
            "cpu_rounds": [], "memory_rounds": [
                {"peak_total_rss": 1e9 * n, "peak_at_s": 5.0, "run_s": 30.0,
                 "processes_at_peak": {"worker": n}, "by_role": {}}]}


PROBE = {"calls": 3, "cold_pull_cpu_ms": 30.0, "pull_cpu_ms": 15.0, "push_cpu_ms": 30.0,
         "rows_per_call": 23000, "dense_params": 475985, "idle_cores": 0.01,
         "core_cold_pull_cpu_ms": 20.0, "core_pull_cpu_ms": 2.0, "core_push_cpu_ms": 6.0,
         "core_push_rows_cpu_ms": 4.0, "core_push_dense_cpu_ms": 2.0}


def test_the_curves_part_has_the_figure_the_issue_reads_its_table_and_its_plot(tmp_path):
    speeds = {1: 2000.0, 2: 3900.0, 4: 7400.0, 8: 9000.0, 12: 9100.0}
    measured = {"arms": {f"async_{n}w": fake_arm(n, s) for n, s in speeds.items()},
                "probe": PROBE, "steps": 20, "configs": {}}
    part = sat.result_part(measured, tmp_path)
    assert part["ratios"]["workers_per_shard_at_90pct"] == 4
    assert part["ratios"]["saturation_efficiency_8w"] == pytest.approx(9000 / 16000)
    assert part["curve"]["workers"] == [1, 2, 4, 8, 12]
    assert part["ratios"]["workers_per_shard_at_90pct_vs_best"] == 4
    # 4096 samples per step at 0.11 cores, one pull and one push of 20 ms at 12 workers
    assert part["curve"]["capacity_samples_per_s"] == pytest.approx(4096 * sat.CORES / 0.04)
    assert "EMULATED" in part["emulation_label"] and "EMULATED" in part["description"]
    assert "| async_8w | 8 | 9,000 | 16,000 | 0.5625 | 0.5625 |" in part["description"]
    assert (tmp_path / "saturation.png").stat().st_size > 0
    json.dumps(part)  # results.json takes it as it is
