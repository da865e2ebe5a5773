"""Scenario `dense`'s assembly with fake runs (no training): the ratios results.json carries,
computed from the arms' figures. Run: pytest -q tests/unit/test_bench_dense.py"""

import json

import pytest

import recsync.bench.dense as dense
from recsync.bench import run_scenario
from recsync.bench import seeds as sd

SPEED = {"fp32": 1000.0, "bf16": 1900.0, "compile": 1050.0, "compile_bf16": 2100.0,
         "threads1": 1900.0, "threads2": 2600.0}
AUC = {"fp32": 0.800, "bf16": 0.801, "compile": 0.800, "compile_bf16": 0.8005}


def _run(cfg, out_dir, name):
    out_dir.mkdir(parents=True, exist_ok=True)
    seed = cfg.train.seed
    return {"mode": "local", "samples": 100_000, "wall_s": 60.0, "train_s": 50.0,
            "startup_s": 5.0 + (20.0 if cfg.train.compile else 0.0),
            "samples_per_s": SPEED[name], "summary_samples_per_s": SPEED[name],
            "first_step_done_s": 1.0, "window_s": 40.0, "worker_step_s_median": 0.3,
            "eval": {"auc": AUC.get(name, 0.8) + 0.001 * seed, "logloss": 0.45, "rows": 1000,
                     "bayes_auc": 0.81},
            "cpu": None, "memory": {"peak_total_rss": 1e9, "run_s": 60.0}}


@pytest.fixture
def fake_runs(monkeypatch):
    monkeypatch.setattr(sd.ov, "run_arm", _run)
    monkeypatch.setattr(dense, "run_arm", _run)
    monkeypatch.setattr(dense, "generate", lambda path, **kw: path.mkdir(parents=True))
    monkeypatch.setattr(dense, "_processes", lambda cfg, dirs: [1600.0, 1500.0])


def test_dense_ratios_are_the_arms_figures_side_by_side(fake_runs, tmp_path):
    results = run_scenario("dense", tmp_path, seeds=3)
    r = results["ratios"]
    assert r["bf16_vs_fp32_speed"] == pytest.approx(1.9)
    assert r["compile_vs_eager_speed"] == pytest.approx(1.05)
    assert r["compile_bf16_vs_bf16_speed"] == pytest.approx(2100 / 1900)
    assert r["bf16_minus_fp32_auc"] == pytest.approx(0.001)
    assert r["compile_bf16_minus_fp32_auc"] == pytest.approx(0.0005)
    assert r["threads2_vs_threads1_speed"] == pytest.approx(2600 / 1900)
    assert r["procs2x1_vs_threads2_speed"] == pytest.approx(3100 / 2600)
    assert results["arms"]["bf16"]["auc_stats"]["n"] == 3
    assert results["compile_startup_s"]["compile"] == [20.0, 20.0, 20.0]
    assert "EMULATED" in results["emulation_label"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["ratios"]["bf16_vs_fp32_speed"] == pytest.approx(1.9)
