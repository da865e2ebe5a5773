"""The seeded scenarios' assembly with a fake run (no Ray, no training): the names that the
issue's checks read in results.json, and ratios computed from the arms' figures."""

import json

import pytest

from recsync.bench import run_scenario
from recsync.bench import seeds as sd

SPEED = {"sync": 1000.0, "gba": 3000.0, "sync_nostraggler": 4000.0, "gba_nostraggler": 4000.0,
         "async": 3100.0, "gba_threshold_1": 2900.0, "sync_only": 2000.0, "gba_only": 2300.0,
         "auto": 2200.0, "none": 8000.0, "s_ma": 7900.0, "s_easgd": 7800.0, "s_bmuf": 7900.0,
         "fr_ma": 7000.0, "fr_easgd": 7000.0, "fr_bmuf": 7000.0, "s_ma_trainers_1": 2000.0,
         "s_ma_trainers_2": 3950.0, "sequential": 1000.0, "eager": 1900.0, "eager_lr": 1850.0,
         "eager_local": 1400.0}


def _summary(cfg, out_dir, name):
    """What ov.run_arm returns, with a speed per arm and an AUC per arm and seed."""
    seed = cfg.train.seed
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"time_s": i, "samples": 4096 * i, "loss": 0.5 - i / 100}) + "\n"
        for i in range(1, 20)))
    workers = cfg.cluster.workers
    return {
        "mode": cfg.mode, "samples": 100_000, "wall_s": 60.0, "train_s": 50.0,
        "samples_per_s": SPEED[name], "summary_samples_per_s": SPEED[name],
        "first_step_done_s": 1.0, "window_s": 40.0, "worker_step_s_median": 0.3,
        "eval": {"auc": 0.80 + 0.001 * seed + (0.002 if name.startswith("gba") else 0.0),
                 "logloss": 0.45, "rows": 1000, "bayes_auc": 0.81},
        "staleness": {"mean": 0.5, "p99": 2, "max": 3}, "gba": None,
        "per_worker": [{"rank": r, "steps": 10} for r in range(workers)],
        "modes": [{"mode": "sync", "from_s": 0.0, "to_s": 50.0, "cause": "start"}],
        "shadow": {"algorithm": cfg.shadow.algorithm, "background": cfg.mode == "shadow",
                   "foreground_every": 1, "sync_gap": {"mean": 1.2, "p99": 2, "max": 3},
                   "syncs_per_s": [2.0], "sync_s_mean": 0.01},
        "eager": {"iteration_s": {"compute": 0.2, "pull_wait": 0.05, "push_wait": 0.0,
                                  "step": 0.25},
                  "tau": {"mean": 1.0, "p99": 2, "max": 2},
                  "multiplier": {"mean": 0.9, "min": 0.5}},
        "emulation": {"label": "EMULATED cluster: test", "workers": [
            {"rank": r, "wall_per_cpu": 6.0, "compute_wall_per_cpu": 5.2, "expected": 5.0}
            for r in range(workers)], "shards": []},
        "cpu": None, "memory": {"peak_total_rss": 1e9, "run_s": 60.0, "processes_at_peak": {},
                                "by_role": {}, "peak_at_s": 1.0, "worker_peak_rss": 1e8}}


@pytest.fixture
def fake_runs(monkeypatch):
    import recsync.bench.eager as eager
    import recsync.bench.emulated as em
    import recsync.bench.switching as switching
    monkeypatch.setattr(sd.ov, "run_arm", _summary)
    monkeypatch.setattr(em, "make_data", lambda path, rows, eval_rows: path)
    monkeypatch.setattr(switching, "straggler_in_the_middle", lambda cfg, out: (20.0, 40.0, 1e3))
    monkeypatch.setattr(eager, "calibrate", lambda data, out: {
        "compute_s": 0.2, "communication_s": 0.05, "latency_ms": 75.0})
    for name in ("stragglers", "switching", "shadow", "eager"):
        monkeypatch.setattr(f"recsync.bench.{name}.plot_runs", lambda *a, **k: None)


def test_stragglers_ratios(fake_runs, tmp_path):
    r = run_scenario("stragglers", tmp_path, seeds=2)
    ratios = r["ratios"]
    assert ratios["gba_speed_vs_ideal"] == pytest.approx(3.0 / 3.25)
    assert ratios["gba_minus_sync_auc"] == pytest.approx(0.002)
    assert ratios["gba_minus_sync_auc_nostraggler"] == pytest.approx(0.002)
    assert r["differences"]["gba_minus_sync_auc"]["n"] == 2
    assert r["ideals"]["sync_vs_sync_nostraggler_speed"]["ideal"] == 0.25
    assert ratios["emulation_worst_worker_deviation"] == pytest.approx(0.04)
    assert len(r["arms"]["async"]["auc_seeds"]) == 1  # seed 0 only
    assert "EMULATED cluster: test" in (tmp_path / "report.md").read_text()


def test_switching_ratios(fake_runs, tmp_path):
    ratios = run_scenario("switching", tmp_path, seeds=2)["ratios"]
    # the straggler from 20 to 40 s of sync's 50 s (share 0.4): sync's work is 20 + 20 / 4 + 10
    # = 35 s at full speed; the ideal run does 20, then 15 at 0.8125: it ends at 38.46 s
    assert ratios["straggler_share_of_sync_run"] == pytest.approx(0.4)
    assert ratios["ideal_auto_vs_sync_speed"] == pytest.approx(50 / (20 + 15 / 0.8125))
    assert ratios["auto_speed_vs_ideal"] == pytest.approx(1.1 / 1.3)
    assert ratios["auto_minus_sync_auc"] == pytest.approx(0.0)


def test_shadow_ratios(fake_runs, tmp_path):
    ratios = run_scenario("shadow", tmp_path, seeds=2)["ratios"]
    assert ratios["shadow_4_vs_1_speed"] == pytest.approx(7900 / 2000)
    for a in ("ma", "easgd", "bmuf"):
        assert f"s_{a}_vs_none_speed" in ratios and f"s_{a}_minus_fr_{a}_auc" in ratios


def test_eager_ratios(fake_runs, tmp_path):
    r = run_scenario("eager", tmp_path, seeds=2)
    assert r["ratios"]["eager_vs_sequential_iter_time"] == pytest.approx(1000 / 1900)
    assert r["ideals"]["eager_vs_sequential_iter_time"]["ideal"] == 0.5
    assert r["ratios"]["eager_local_vs_sequential_iter_time"] == pytest.approx(1000 / 1400)
    assert "eager_local_minus_eager_auc" in r["ratios"]
