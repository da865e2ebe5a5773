"""Scenario `simulated`'s assembly with fake runs and fake simulations (no Ray, no training):
the names the issue's checks read in results.json, computed from the arms' figures, and the
simulations given the real runs' compute per step."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

import recsync.bench.simulated as scenario
from recsync.bench import run_scenario
from recsync.bench import seeds as sd

REAL_SPEED = 1000.0
COMPUTE_S = 0.05


def _metrics(out_dir, speed: float, log_steps=None, compute_s: float = COMPUTE_S,
             own=None, workers: int = 1) -> None:
    """Lines of 4 steps each whose mean step time is 0.1 s x exp(``log_steps[i]``) (none
    without ``log_steps``), each of ``workers`` workers' times exp(+-``own[i]``) (every other
    worker the other sign), the workers' compute ``compute_s`` per step."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def step_s(i: int) -> list[float]:
        o = own[i % len(own)] if own else 0.0
        return [0.1 * math.exp(log_steps[i % len(log_steps)] + (-1) ** r * o)
                for r in range(workers)]

    (out_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"time_s": i, "samples": int(speed * i), "loss": 0.5, "step": 4 * i,
                    "worker_compute_s": [compute_s, compute_s],
                    **({"worker_step_s": step_s(i)} if log_steps else {})}) + "\n"
        for i in range(1, 40)))


# two workers' lines: a common part (+-0.06) and each one's own (+-0.02, opposite signs),
# orthogonal over every 4 lines: their correlation is (0.06^2 - 0.02^2) / (0.06^2 + 0.02^2)
COMMON, OWN, SHARE = [0.06, 0.06, -0.06, -0.06], [0.02, -0.02, 0.02, -0.02], 0.8


def test_the_common_share_of_the_jitter_is_two_workers_correlation(tmp_path):
    """Two workers whose lines move together by a common part and apart by their own: the
    share is their correlation; workers in exact step give 1; one worker, steady lines (no
    correlation to read) or too few lines give nothing; the median over the runs."""
    _metrics(tmp_path / "a", 1000.0, COMMON, own=OWN, workers=2)
    _metrics(tmp_path / "b", 1000.0, COMMON, workers=3)
    _metrics(tmp_path / "c", 1000.0, [0.0], workers=2)
    _metrics(tmp_path / "d", 1000.0, COMMON)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "metrics.jsonl").write_text("")
    runs = {n: {"out_dir": str(tmp_path / n)} for n in "abcde"}
    assert scenario.real_jitter_common([runs["a"]]) == pytest.approx(SHARE, rel=1e-3)
    assert scenario.real_jitter_common([runs["b"]]) == pytest.approx(1.0)
    assert scenario.real_jitter_common([runs[n] for n in "cde"]) == 0.0
    assert scenario.real_jitter_common(list(runs.values())) == pytest.approx((SHARE + 1) / 2,
                                                                              rel=1e-3)


def test_the_jitter_of_real_steps_is_read_from_the_means_of_their_metrics_lines(tmp_path):
    """A line's mean of k steps varies by jitter / sqrt(k): lines of 4 steps whose log means
    are +-0.05 give a jitter of about 0.05 x sqrt(4); steady lines give none; the median over
    the runs, and a run with too few lines left out."""
    _metrics(tmp_path / "a", 1000.0, [0.05, -0.05])
    _metrics(tmp_path / "b", 1000.0, [0.0])
    runs = [{"out_dir": str(tmp_path / n)} for n in ("a", "b")]
    assert scenario.real_jitter(runs[:1]) == pytest.approx(0.1, rel=0.05)
    assert scenario.real_jitter(runs[1:]) == pytest.approx(0.0, abs=1e-9)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metrics.jsonl").write_text("")
    runs.append({"out_dir": str(tmp_path / "c")})
    assert scenario.real_jitter(runs + runs[:1]) == pytest.approx(0.1, rel=0.05)
    assert scenario.real_jitter(runs[2:]) == 0.0


def _summary(cfg, name: str, speed: float) -> dict:
    seed = cfg.train.seed
    better = {"gba": 0.0005, "shadow": 0.001}.get(cfg.mode, 0.0)
    return {"mode": cfg.mode, "samples": 100_000, "wall_s": 60.0, "train_s": 50.0,
            "samples_per_s": speed, "summary_samples_per_s": speed,
            "eval": {"auc": 0.80 + 0.001 * seed + better,
                     "logloss": 0.45, "rows": 1000, "bayes_auc": 0.81},
            "shadow": {"syncs": [3] * cfg.cluster.workers},
            "staleness": {"mean": 1.0 if cfg.mode != "sync" else 0.0, "p99": 2, "max": 3},
            "per_worker": [{"rank": r, "steps": 10} for r in range(cfg.cluster.workers)]}


def fake_real(cfg, out_dir, name):
    assert cfg.emulation.cores_per_worker == scenario.CORES_PER_WORKER
    n = cfg.cluster.workers
    if n == 1:
        _metrics(out_dir, REAL_SPEED, [0.05, -0.05])  # a jitter of 0.1
    else:  # the common share: 0.8 of two async or gba workers, 1 elsewhere (not read)
        _metrics(out_dir, REAL_SPEED, COMMON, workers=n,
                 own=OWN if n == 2 and cfg.mode in ("async", "gba") else None)
    # the shards' pacing charged 3 ms of CPU a call
    shards = [{"cpu_s": 0.6, "requests": 200}, {"cpu_s": 0.3, "requests": 100}]
    # the workers' pacing: 40% of their CPU outside the compute before it
    workers = [{"cpu_s": 1.0, "compute_cpu_s": 0.5, "pre_compute_cpu_s": 0.2}]
    return {**_summary(cfg, name, REAL_SPEED), "first_step_done_s": 1.0, "window_s": 30.0,
            "worker_step_s_median": 0.1, "memory": None, "cpu": None,
            "out_dir": str(out_dir), "emulation": {"label": "EMULATED", "shards": shards,
                                                    "workers": workers}}


SIMULATED = []


def fake_simulate(cfg, out_dir, timing, overwrite):
    """Sync runs at the slowest worker's pace, gba and async at the mean's; shadow's trainers
    at 95% of linear scaling (100% with free shards)."""
    n = cfg.cluster.workers
    SIMULATED.append((cfg.mode, n, timing))
    factors = timing.speeds.schedule(n).initial()
    speed = 1100.0 * (1 / max(factors) if cfg.mode == "sync"
                      else sum(1 / f for f in factors) / len(factors))
    if cfg.mode == "shadow" and cfg.train.max_steps:  # the throughput arms
        speed *= n * (1.0 if n == 1 or timing.pull_call_s == 0 else 0.95)
    if timing.paced:  # half the worker's own CPU hidden behind its waits
        batch = cfg.train.batch_size
        speed = batch / (batch / speed + 0.5 * (timing.pull_side_s + timing.push_side_s))
        if cfg.cluster.workers in scenario.VALIDATION_WORKERS:  # off by 10% where validated
            speed *= 1.1
    _metrics(out_dir, speed)
    return {**_summary(cfg, "", speed),
            "simulated": {"real_wall_s": 7.0 * n, "simulated_train_s": 50.0,
                          "shard_busy_frac": [0.5] * cfg.cluster.ps_shards,
                          # each shard served 10 calls of a pull's fixed cost
                          "shard_busy_s": [10 * timing.pull_call_s] * cfg.cluster.ps_shards,
                          "shard_calls": [10] * cfg.cluster.ps_shards}}


@pytest.fixture
def fakes(monkeypatch):
    SIMULATED.clear()
    monkeypatch.setattr(sd.ov, "run_arm", fake_real)
    monkeypatch.setattr(scenario.em, "make_data", lambda path, rows, eval_rows: path)
    monkeypatch.setattr(scenario, "simulate", fake_simulate)
    monkeypatch.setattr(scenario, "measure_compute_s", lambda cfg, ds: 0.02)
    monkeypatch.setattr(scenario, "measure_sides", lambda cfg, ds, timing: (0.001, 0.003))
    monkeypatch.setattr(scenario, "Dataset",
                        lambda path: SimpleNamespace(rows=lambda split: 1_000_000))
    monkeypatch.setattr(scenario, "PARALLEL", 1)  # the fakes live in this process only


def test_the_scenario_writes_the_ratios_the_issue_names(fakes, tmp_path):
    results = run_scenario("simulated", tmp_path, scale=1.0, seeds=2)
    r = results["ratios"]
    # the calibrated one worker runs at the real 1000 samples/s, 2 and 4 at 1100
    assert r["validation_speed_error_max"] == pytest.approx(0.1)
    assert r["gba_vs_sync_speed_128"] == pytest.approx(r["ideal_speed_ratio_128"])
    assert r["gba_vs_sync_speed_128"] > 2.4
    assert r["gba_minus_sync_auc_128"] == pytest.approx(0.0005)
    assert r["shadow_64_vs_1_efficiency"] == pytest.approx(0.95)
    assert r["shadow_64_vs_1_efficiency_free_shards"] == pytest.approx(1.0)
    assert r["S-ma_minus_FR-ma_auc"] == pytest.approx(0.001)
    assert r["wall_s_512"] == pytest.approx(7.0 * 512)
    written = json.loads((tmp_path / "results.json").read_text())
    assert set(written["ratios"]) >= {"validation_speed_error_max", "gba_vs_sync_speed_128",
                                      "gba_minus_sync_auc_128", "shadow_64_vs_1_efficiency",
                                      "wall_s_512"}
    assert (tmp_path / "report.md").exists()


def test_validation_simulations_take_the_real_runs_compute(fakes, tmp_path):
    run_scenario("simulated", tmp_path, scale=1.0, seeds=1)
    shadow = [(m, n, t) for m, n, t in SIMULATED if m in ("shadow", "foreground")]
    others = [x for x in SIMULATED if x not in shadow]
    small = [(m, n, t) for m, n, t in others if n in scenario.VALIDATION_WORKERS]
    calibrations = [(m, t) for m, n, t in others if n == 1]
    assert sorted(m for m, _ in calibrations) == sorted(
        scenario.VALIDATION_MODES * (2 + scenario.CALIBRATION_ROUNDS))
    assert all(t.compute_s == COMPUTE_S and t.paced for _, t in calibrations)
    assert sum(t.pull_side_s == t.push_side_s == 0.0 for _, t in calibrations) == 6
    # the shards' costs as bench ps measured them, then scaled to the real runs' 3 ms of CPU
    # a call: the simulations of 2 and 4 workers and the fit's after the first
    measured = scenario.emulated_shard_time()
    assert sum(t.pull_call_s == measured.pull_call_s for _, t in calibrations) == 3
    scale = 3e-3 / (measured.pull_call_s * scenario.CORES_PER_SHARD)
    for t in [t for _, t in calibrations if t.pull_call_s != measured.pull_call_s] + [
            t for _, _, t in small]:
        assert t.pull_call_s * scenario.CORES_PER_SHARD == pytest.approx(3e-3)
        assert t.push_s_per_row == pytest.approx(measured.push_s_per_row * scale)
    assert {(m, n) for m, n, _ in small} == {(m, n) for m in scenario.VALIDATION_MODES
                                            for n in scenario.VALIDATION_WORKERS}
    assert all(t.compute_s == COMPUTE_S for _, _, t in small)
    # the real one-worker runs' jitter, in the calibration and the validation's simulations
    assert all(t.jitter == pytest.approx(0.1, rel=0.05) for _, t in calibrations)
    assert all(t.jitter == pytest.approx(0.1, rel=0.05) for _, _, t in small)
    # its share common to the workers: two real async and gba workers' correlation
    assert all(t.jitter_common == pytest.approx(SHARE, rel=1e-3) for _, t in calibrations)
    assert all(t.jitter_common == pytest.approx(SHARE, rel=1e-3) for _, _, t in small)
    # the overhead fitted on one worker: the real step (batch / 1000 samples/s) against the
    # simulated one without overhead (batch / 1100); the fake hides half of it behind waits,
    # so the fit charges twice the difference
    real_step = scenario.VALIDATION_BATCH / REAL_SPEED
    sim_step = scenario.VALIDATION_BATCH / 1100.0
    # split as the real runs' pacing split it: 40% before the compute, the rest after (not as
    # measured here: a quarter before) (the fake's metrics hold whole samples: the fit is
    # exact to about 1e-4)
    assert all(t.pull_side_s == pytest.approx(0.4 * 2 * (real_step - sim_step), rel=1e-3)
               and t.push_side_s == pytest.approx(0.6 * 2 * (real_step - sim_step), rel=1e-3)
               and t.paced for _, _, t in small)
    scaled = [t for _, n, t in others if n not in (1, *scenario.VALIDATION_WORKERS)]
    assert scaled and all(t.compute_s == 0.02 and (t.pull_side_s, t.push_side_s)
                          == (0.001, 0.003) and t.jitter == 0.0 for t in scaled)
    # shadow's arms: the costs measured here; half of the throughput arms with free shards
    assert all(t.compute_s == 0.02 and (t.pull_side_s, t.push_side_s) == (0.001, 0.003)
               for _, _, t in shadow)
    free = [n for m, n, t in shadow if t.pull_call_s == t.push_call_s == t.pull_s_per_row == 0]
    assert sorted(free) == [1, 4, 16, 64]
    # every seed at 128 workers; 32 and 512 once
    two = run_scenario("simulated", tmp_path / "two", scale=1.0, seeds=2)
    assert len(two["arms"]["gba_128"]["auc_seeds"]) == 2
    assert len(two["arms"]["gba_512"]["auc_seeds"]) == 1


def test_the_validation_alone_gives_the_whole_scenarios_validation(fakes, tmp_path):
    """Scenario simulated_validation: the validation's arms and ratios as `simulated` writes
    them, without the scale arms."""
    alone = run_scenario("simulated_validation", tmp_path / "alone", scale=1.0, seeds=1)
    whole = run_scenario("simulated", tmp_path / "whole", scale=1.0, seeds=1)
    assert alone["ratios"] == {k: whole["ratios"][k] for k in alone["ratios"]}
    assert set(alone["ratios"]) == {"validation_speed_error_max",
                                    "validation_staleness_difference_max"}
    assert set(alone["arms"]) == {n for n in whole["arms"] if n.startswith(("real_", "sim_"))}
    assert not any(n.endswith("_128") for n in alone["arms"])
    written = json.loads((tmp_path / "alone" / "results.json").read_text())
    assert written["ratios"]["validation_speed_error_max"] == pytest.approx(0.1)


def test_each_seeds_simulation_computes_as_long_as_that_seeds_real_run(fakes, tmp_path,
                                                                       monkeypatch):
    """The machine drifts between seeds: real seed 1 computes twice as long per step as seed
    0. The validation's simulation of each seed takes that seed's compute; the calibration on
    one worker the median of the seeds'."""
    def drifting(cfg, out_dir, name):
        summary = fake_real(cfg, out_dir, name)
        _metrics(out_dir, REAL_SPEED, [0.05, -0.05], COMPUTE_S * (1 + cfg.train.seed))
        return summary
    seen = []

    def recording(cfg, out_dir, timing, overwrite):
        seen.append((cfg.cluster.workers, cfg.train.seed, timing.compute_s))
        return fake_simulate(cfg, out_dir, timing, overwrite)
    monkeypatch.setattr(sd.ov, "run_arm", drifting)
    monkeypatch.setattr(scenario, "simulate", recording)
    run_scenario("simulated_validation", tmp_path, scale=1.0, seeds=2)
    validated = {(seed, round(c, 6)) for n, seed, c in seen if n in scenario.VALIDATION_WORKERS}
    assert validated == {(0, COMPUTE_S), (1, 2 * COMPUTE_S)}
    assert {round(c, 6) for n, _, c in seen if n == 1} == {round(1.5 * COMPUTE_S, 6)}


def _shard_run(train_s: float, calls: int, per_call_s: float, per_s: float) -> dict:
    """A real EMULATED run's summary whose two shards each spent ``per_call_s`` a call and
    ``per_s`` of a core by the second of its ``train_s``."""
    shards = [{"requests": n, "cpu_s": n * per_call_s + per_s * train_s}
              for n in (calls, calls // 2)]
    return {"train_s": train_s, "emulation": {"shards": shards}}


def test_a_shards_cpu_is_split_into_per_call_and_by_the_second_when_runs_differ_in_length():
    from recsync.bench.simulated_readings import shard_cpu_split
    runs = [_shard_run(t, 940, 1.2e-3, 0.035) for t in (27.0, 13.0, 6.5)]
    per_call, per_s = shard_cpu_split(runs)
    assert per_call == pytest.approx(1.2e-3) and per_s == pytest.approx(0.035)
    assert shard_cpu_split([_shard_run(27.0, 940, 1.2e-3, 0.035)] * 3) is None  # one length
    assert shard_cpu_split([]) is None


def test_the_calibration_charges_a_shard_per_call_and_its_background_by_the_gap(fakes,
                                                                              tmp_path):
    """At one worker a shard's CPU per call (here 2.6 ms) holds its process's CPU by the
    second; fitted over runs of every size, a call costs 1.2 ms and each second since the
    shard's last call 0.035 of a core: the simulations' shards are scaled to the former and
    charged the latter on the shard's cores (Timing.shard_background), also at 2 and 4
    workers."""
    from recsync.api import override
    cfg = override(scenario.base_config(tmp_path, "async", 1, scenario.SHARDS,
                                        scenario.VALIDATION_BATCH),
                   **{"emulation.cores_per_worker": scenario.CORES_PER_WORKER,
                      "emulation.cores_per_shard": scenario.CORES_PER_SHARD})
    (tmp_path / "real").mkdir()
    one = {**fake_real(cfg, tmp_path / "real", "real_async_1"),
           **_shard_run(27.0, 940, 1.2e-3, 0.035)}
    mode_runs = [one] + [_shard_run(t, 940, 1.2e-3, 0.035) for t in (13.0, 6.5)]
    shard_time = scenario.emulated_shard_time()
    c = scenario.calibrate(tmp_path, "async", [one], shard_time, tmp_path / "cal", mode_runs)
    assert c["shard_cpu_per_call_real_s"] == pytest.approx(1.2e-3 + 0.035 * 27.0 * 2 / 1410)
    assert c["shard_cpu_per_call_fitted_s"] == pytest.approx(1.2e-3)
    assert c["shard_background"] == pytest.approx(0.035 / scenario.CORES_PER_SHARD)
    modelled = shard_time.pull_call_s * scenario.CORES_PER_SHARD  # (the fake's 10 calls)
    assert c["shard_scale"] == pytest.approx(1.2e-3 / modelled)
    # the fit's simulations after the one without background are charged it
    charged = [t for m, n, t in SIMULATED if n == 1]
    assert charged[0].shard_background == 0.0
    assert all(t.shard_background == c["shard_background"] for t in charged[1:])


def test_the_validations_simulations_are_charged_their_modes_fitted_shard_background(
        fakes, monkeypatch, tmp_path):
    def real_by_size(cfg, out_dir, name):
        real = fake_real(cfg, out_dir, name)
        fitted = _shard_run(27.0 / cfg.cluster.workers, 940, 1.2e-3, 0.035)
        return {**real, "train_s": fitted["train_s"],
                "emulation": {**real["emulation"], **fitted["emulation"]}}

    monkeypatch.setattr(sd.ov, "run_arm", real_by_size)
    run_scenario("simulated_validation", tmp_path, scale=1.0, seeds=1)
    small = [t for m, n, t in SIMULATED if n in scenario.VALIDATION_WORKERS]
    assert len(small) == len(scenario.VALIDATION_MODES) * len(scenario.VALIDATION_WORKERS)
    assert all(t.shard_background == pytest.approx(0.035 / scenario.CORES_PER_SHARD)
               for t in small)
    scale = 1.2e-3 / (scenario.emulated_shard_time().pull_call_s * scenario.CORES_PER_SHARD)
    assert all(t.pull_call_s == pytest.approx(scenario.emulated_shard_time().pull_call_s * scale)
               for t in small)


def test_each_simulation_charges_its_real_runs_own_cpu_outside_the_compute(fakes, monkeypatch,
                                                                           tmp_path):
    """A worker's CPU per step outside its compute is a measurement of each real run, as its
    compute is: where the run of 4 workers spent 10% less of it than the one-worker runs, its
    simulation's sides are the calibrated ones x 0.9."""
    from recsync.bench.simulated_readings import real_side_cpu_s, run_sides

    def real_with_steps(cfg, out_dir, name):
        real = fake_real(cfg, out_dir, name)
        outside = 0.9 if cfg.cluster.workers == 4 else 1.0  # CPU s outside the compute
        workers = [{"cpu_s": 0.5 + outside, "compute_cpu_s": 0.5, "pre_compute_cpu_s": 0.2,
                    "steps": 100}]
        return {**real, "emulation": {**real["emulation"], "workers": workers}}

    monkeypatch.setattr(sd.ov, "run_arm", real_with_steps)
    results = run_scenario("simulated_validation", tmp_path, scale=1.0, seeds=1)
    calibrated = results["calibration"]["async"]
    assert calibrated["side_cpu_s"] == pytest.approx(0.01)
    by_size = {n: t for m, n, t in SIMULATED if m == "async" and n > 1}
    for side in ("pull_side_s", "push_side_s"):
        assert getattr(by_size[2], side) == pytest.approx(calibrated["sides"][side])
        assert getattr(by_size[4], side) == pytest.approx(
            0.9 * calibrated["sides"][side])
    assert real_side_cpu_s({"emulation": {"workers": [{"cpu_s": 1.0}]}}) is None
    assert run_sides({}, {"sides": {"pull_side_s": 0.02}, "side_cpu_s": None}) == {
        "pull_side_s": 0.02}


def test_the_latency_is_fitted_to_the_real_one_worker_runs_pull_round_trip(fakes, monkeypatch,
                                                                          tmp_path):
    """A real pull came back in 10 ms at one worker, a simulated one in 4 ms of service and its
    latency there and back: the latency becomes what makes up the 10 ms (the worker's handling
    of the call and its transport), 3 ms each way, in the calibration's result and every
    simulation of 2 and 4 workers."""
    def real_with_pulls(cfg, out_dir, name):
        real = fake_real(cfg, out_dir, name)
        workers = [{**w, "pull_s": 0.010} for w in real["emulation"]["workers"]]
        return {**real, "emulation": {**real["emulation"], "workers": workers}}

    def simulate_with_pulls(cfg, out_dir, timing, overwrite):
        summary = fake_simulate(cfg, out_dir, timing, overwrite)
        summary["simulated"]["per_worker"] = [{"pull_s": 0.004 + 2 * timing.latency_s}]
        return summary

    monkeypatch.setattr(sd.ov, "run_arm", real_with_pulls)
    monkeypatch.setattr(scenario, "simulate", simulate_with_pulls)
    results = run_scenario("simulated_validation", tmp_path, scale=1.0, seeds=1)
    base = scenario.emulated_shard_time().latency_s
    for calibrated in results["calibration"].values():
        assert calibrated["pull_s_real"] == pytest.approx(0.010)
        assert calibrated["pull_s_simulated"] == pytest.approx(0.004 + 2 * base)
        assert calibrated["latency_s"] == pytest.approx(0.003)
    small = [t for m, n, t in SIMULATED if n in scenario.VALIDATION_WORKERS]
    assert small and all(t.latency_s == pytest.approx(0.003) for t in small)
