"""The seeded scenarios' statistics, ideal speed ratios and emulation checks (no Ray)."""

import math

import pytest

from recsync.bench import emulated as em
from recsync.bench import run_scenario
from recsync.bench import seeds as sd
from recsync.config import load_config


def test_describe_uses_the_sample_standard_deviation():
    d = sd.describe([1.0, 2.0, 3.0, 4.0])
    assert d["n"] == 4 and d["mean"] == 2.5 and d["min"] == 1.0 and d["max"] == 4.0
    assert d["sd"] == pytest.approx(math.sqrt(5 / 3))
    assert sd.describe([0.7])["sd"] is None


def test_t_interval_matches_the_t_table():
    # mean 3, sd sqrt(2.5), t(0.975, 4) = 2.776445 (printed tables)
    lo, hi = sd.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert lo == pytest.approx(3 - half, abs=1e-5) and hi == pytest.approx(3 + half, abs=1e-5)
    # two values: t(0.975, 1) = 12.7062
    lo, hi = sd.t_interval([0.0, 1.0])
    assert hi - lo == pytest.approx(2 * 12.7062 * math.sqrt(0.5) / math.sqrt(2), abs=1e-3)
    assert sd.t_interval([0.5]) is None


def test_paired_difference_is_per_seed_a_minus_b():
    d = sd.paired_difference([0.80, 0.82, 0.81], [0.79, 0.80, 0.81])
    assert d["values"] == pytest.approx([0.01, 0.02, 0.0])
    assert d["mean"] == pytest.approx(0.01)
    lo, hi = d["ci95"]
    assert lo < 0.01 < hi
    # a constant shift has no spread: the interval is the point, however noisy the arms are
    d = sd.paired_difference([0.70, 0.90, 0.80], [0.69, 0.89, 0.79])
    assert d["ci95"][0] == pytest.approx(0.01) and d["ci95"][1] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="same number of seeds"):
        sd.paired_difference([0.8, 0.8], [0.8])


def test_auc_difference_pairs_the_seeds_both_arms_ran():
    arms = {"a": {"auc_seeds": [0.80]}, "b": {"auc_seeds": [0.78, 0.70, 0.60]}}
    d = sd.auc_difference(arms, "a", "b")
    assert d["n"] == 1 and d["mean"] == pytest.approx(0.02) and d["ci95"] is None


def test_difference_row_shows_the_interval_or_says_there_is_none():
    row = sd.difference_row("x", sd.paired_difference([0.8, 0.81], [0.8, 0.8]))
    assert row[0] == "x" and row[1] == pytest.approx(0.005) and "95% t-interval" in row[2]
    assert "no interval" in sd.difference_row("y", sd.paired_difference([0.8], [0.7]))[2]


def test_seeded_runs_interleave_arms_and_set_the_seed(monkeypatch, tmp_path):
    calls = []

    def fake_run_arm(cfg, out_dir, name):
        calls.append((name, cfg.train.seed, out_dir.relative_to(tmp_path).as_posix()))
        return {"eval": {"auc": 0.5 + cfg.train.seed / 100}}

    monkeypatch.setattr(sd.ov, "run_arm", fake_run_arm)
    base = load_config(None, ['mode="sync"'])
    runs = sd.seeded_runs(["a", "b", "ref"], lambda name: base, tmp_path, 3, once=("ref",))
    assert [(n, s) for n, s, _ in calls] == [("a", 0), ("b", 0), ("ref", 0), ("a", 1),
                                             ("b", 1), ("a", 2), ("b", 2)]
    assert calls[3][2] == "arms/a/seed1"
    assert [r["eval"]["auc"] for r in runs["a"]] == [0.5, 0.51, 0.52] and len(runs["ref"]) == 1
    with pytest.raises(ValueError, match="--seeds"):
        sd.seeded_runs(["a"], lambda name: base, tmp_path, 0)


def test_ideal_speed_ratio():
    assert em.ideal_speed_ratio([4.0, 1.0, 1.0, 1.0]) == pytest.approx(3.25)
    assert em.ideal_speed_ratio([1.0, 1.0]) == 1.0


def _simulate(factors, window, sync_s, dt=2e-3):
    """Both runs stepped with a small clock tick: the rate of samples per second (R = 1) of sync
    (slowest worker) and of the ideal run (mean of the workers' speeds) inside the window."""
    slow, fast = 1 / max(factors), sum(1 / f for f in factors) / len(factors)
    inside = lambda t: window[0] <= t < window[1]  # noqa: E731
    t = done = 0.0
    while t < sync_s:  # D: what sync does in sync_s
        done += (slow if inside(t) else 1.0) * dt
        t += dt
    t = work = 0.0
    while work < done:
        work += (fast if inside(t) else 1.0) * dt
        t += dt
    return sync_s / t


@pytest.mark.parametrize("window", [(0.0, 100.0), (10.0, 20.0), (60.0, 90.0), (95.0, 99.0),
                                    (80.0, 200.0), (120.0, 150.0), (30.0, 30.0)])
def test_ideal_windowed_speed_ratio_matches_a_simulation(window):
    factors = [4.0, 1.0, 1.0, 1.0]
    expected = _simulate(factors, window, 100.0)
    assert em.ideal_windowed_speed_ratio(factors, window, 100.0) == pytest.approx(expected,
                                                                                  rel=1e-3)


def test_ideal_windowed_speed_ratio_limits():
    f = [4.0, 1.0, 1.0, 1.0]
    assert em.ideal_windowed_speed_ratio(f, (0.0, 50.0), 50.0) == pytest.approx(3.25)
    assert em.ideal_windowed_speed_ratio(f, (60.0, 90.0), 50.0) == 1.0  # after sync ended
    # the straggler present for a third of sync's run: 1 / (1 - (0.8125 - 0.25) / 3)
    assert em.ideal_windowed_speed_ratio(f, (30.0, 60.0), 90.0) == pytest.approx(
        1 / (1 - 0.5625 / 3))


def _emulation(computes, expected=(16.0, 4.0)):
    return {"label": "EMULATED cluster: 2 workers x 0.25 cores, 1 shards x 0.25 cores",
            "workers": [{"rank": r, "steps": 10, "cpu_s": 1.0, "paced_wall_s": 20.0,
                         "wall_per_cpu": 20.0, "compute_wall_per_cpu": c, "expected": e}
                        for r, (c, e) in enumerate(zip(computes, expected))],
            "shards": [{"shard": 0, "requests": 40, "cpu_s": 1.0, "paced_wall_s": 4.0,
                        "wall_per_cpu": 4.0, "expected": 4.0}]}


def test_emulation_rows_flag_a_worker_off_its_cores():
    arms = {"gba": {"emulation_seeds": [_emulation([16.2, 4.1]), _emulation([16.0, 4.8])]},
            "plain": {"emulation_seeds": [None]}}
    rows = em.emulation_rows(arms)
    assert [r[0] for r in rows] == ["gba: worker 0 wall / CPU of its compute",
                                    "gba: worker 1 wall / CPU of its compute",
                                    "gba: PS shard 0 service time / CPU"]
    assert rows[1][1] == pytest.approx(4.45) and "more than 10%" in rows[1][2]
    assert "more than" not in rows[0][2] and "whole steps (waits included) 20, 20" in rows[0][2]
    assert em.worst_worker_deviation(arms) == pytest.approx(0.2)
    assert em.label(arms).startswith("EMULATED cluster: 2 workers x 0.25 cores")
    assert em.label({"plain": arms["plain"]}).startswith("Not emulated")
    assert em.worst_worker_deviation({"plain": arms["plain"]}) is None
    # a worker that computed nothing has no ratio: shown as n/a, not counted
    arms = {"x": {"emulation_seeds": [_emulation([None, 4.0])]}}
    assert "n/a" in em.emulation_rows(arms)[0][2] and em.worst_worker_deviation(arms) == 0.0


def test_seeds_only_for_the_seeded_scenarios(tmp_path):
    with pytest.raises(ValueError, match="--seeds applies to"):
        run_scenario("overhead", tmp_path, seeds=2)
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        run_scenario("stragglers", tmp_path, seeds=0)


def test_spec_text_names_only_what_differs_from_the_default():
    from recsync.data.synthetic import SynthSpec
    assert em.spec_text(SynthSpec()) == "SynthSpec()"
    assert em.spec_text(SynthSpec(head_rank=5.0, interacting_tables=(4, 5))) == \
        "SynthSpec(interacting_tables=(4, 5), head_rank=5.0)"


def test_cli_bench_refuses_seeds_for_an_unseeded_scenario(tmp_path):
    from click.testing import CliRunner

    from recsync.cli import main
    result = CliRunner().invoke(main, ["bench", "overhead", "--out", str(tmp_path / "o"),
                                       "--seeds", "2"])
    assert result.exit_code != 0 and "--seeds applies to" in result.output
