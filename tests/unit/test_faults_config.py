"""Fault emulation settings: straggle_factor, the faults section's validation against the
cluster, its TOML round trip, and the driver's staleness summary of shard stats (no Ray)."""

from __future__ import annotations

import math

import pytest

from recsync.config import ConfigError, RunConfig, load_config
from recsync.run.summary import per_worker, staleness
from recsync.worker.worker import straggle_factor


def run_config(stragglers=(), kills=(), mode="async", workers=3, ps_shards=2, **faults):
    return RunConfig.model_validate({
        "mode": mode,
        "cluster": {"workers": workers, "ps_shards": ps_shards},
        "faults": {"stragglers": list(stragglers), "kills": list(kills), **faults},
    })


# ------------------------------------------------------------------------------------ stragglers

def test_straggle_factor_inside_and_outside_the_window():
    cfg = run_config([{"worker": 1, "factor": 3.0, "start_s": 10.0, "end_s": 20.0}])
    assert straggle_factor(cfg, 1, 0.0) == 1.0
    assert straggle_factor(cfg, 1, 9.999) == 1.0
    assert straggle_factor(cfg, 1, 10.0) == 3.0   # start is inclusive
    assert straggle_factor(cfg, 1, 15.0) == 3.0
    assert straggle_factor(cfg, 1, 19.999) == 3.0
    assert straggle_factor(cfg, 1, 20.0) == 1.0   # end is exclusive
    assert straggle_factor(cfg, 1, 1e6) == 1.0


def test_straggle_factor_only_slows_the_configured_worker():
    cfg = run_config([{"worker": 2, "factor": 4.0}])
    assert [straggle_factor(cfg, r, 5.0) for r in range(3)] == [1.0, 1.0, 4.0]


def test_straggle_factor_defaults_to_the_whole_run():
    cfg = run_config([{"worker": 0, "factor": 2.5}])
    assert straggle_factor(cfg, 0, 0.0) == 2.5
    assert straggle_factor(cfg, 0, 1e9) == 2.5


def test_straggle_factor_of_overlapping_stragglers_is_the_max():
    cfg = run_config([
        {"worker": 0, "factor": 2.0, "start_s": 0.0, "end_s": 30.0},
        {"worker": 0, "factor": 5.0, "start_s": 10.0, "end_s": 20.0},
        {"worker": 0, "factor": 3.0, "start_s": 15.0, "end_s": 40.0},
        {"worker": 1, "factor": 9.0},
    ])
    assert straggle_factor(cfg, 0, 5.0) == 2.0
    assert straggle_factor(cfg, 0, 12.0) == 5.0
    assert straggle_factor(cfg, 0, 17.0) == 5.0
    assert straggle_factor(cfg, 0, 25.0) == 3.0
    assert straggle_factor(cfg, 0, 35.0) == 3.0
    assert straggle_factor(cfg, 0, 45.0) == 1.0


def test_no_stragglers_means_full_speed():
    cfg = run_config()
    assert all(straggle_factor(cfg, r, t) == 1.0 for r in range(3) for t in (0.0, 100.0))


# ------------------------------------------------------------------------------------ validation

def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_straggler_beyond_the_workers_is_rejected_with_its_index(tmp_path):
    path = write(tmp_path, """
mode = "sync"
[cluster]
workers = 2
[[faults.stragglers]]
worker = 1
factor = 2.0
[[faults.stragglers]]
worker = 2
factor = 2.0
""")
    with pytest.raises(ConfigError, match=r"faults\.stragglers\[1\]") as e:
        load_config(path)
    assert "cluster.workers" in str(e.value)
    load_config(path, ["cluster.workers=3"])  # valid once there are enough workers


@pytest.mark.parametrize("target,index,ok_override", [
    ("worker", 3, "cluster.workers=4"),
    ("ps", 2, "cluster.ps_shards=3"),
])
def test_kill_beyond_the_targets_is_rejected_with_its_index(tmp_path, target, index,
                                                            ok_override):
    path = write(tmp_path, f"""
mode = "async"
[cluster]
workers = 3
ps_shards = 2
[[faults.kills]]
target = "worker"
index = 0
at_s = 1.0
[[faults.kills]]
target = "{target}"
index = {index}
at_s = 5.0
""")
    with pytest.raises(ConfigError, match=r"faults\.kills\[1\]") as e:
        load_config(path)
    assert ok_override.split("=")[0] in str(e.value)  # the key that counts them
    assert "pss" not in str(e.value)
    load_config(path, [ok_override])


def test_kill_index_is_checked_against_the_count_of_its_own_target():
    # 3 workers but 1 shard: ps index 1 is bad, worker index 2 is fine
    run_config(kills=[{"target": "worker", "index": 2, "at_s": 1.0}], workers=3, ps_shards=1)
    with pytest.raises(ValueError, match=r"faults\.kills\[0\]"):
        run_config(kills=[{"target": "ps", "index": 1, "at_s": 1.0}], workers=3, ps_shards=1)


@pytest.mark.parametrize("override", [
    "faults.stragglers=[{worker = 0, factor = 2.0}]",
    "faults.kills=[{target = \"worker\", index = 0, at_s = 1.0}]",
    "faults.kill_mean_s=10.0",
])
def test_faults_in_local_mode_are_rejected(override):
    with pytest.raises(ConfigError, match="distributed mode"):
        load_config(None, ["mode=\"local\"", override])
    load_config(None, ["mode=\"sync\"", override])  # the same faults are fine distributed


def test_bad_fault_values_are_rejected():
    with pytest.raises(ConfigError, match=r"faults\.stragglers\.0\.factor"):
        load_config(None, ["mode=\"sync\"", "faults.stragglers=[{worker = 0, factor = 0.5}]"])
    with pytest.raises(ConfigError, match=r"faults\.kills\.0\.target"):
        load_config(None, ["mode=\"sync\"",
                           "faults.kills=[{target = \"driver\", index = 0, at_s = 1.0}]"])


def test_faults_round_trip_through_toml(tmp_path):
    cfg = run_config(
        [{"worker": 0, "factor": 2.0}, {"worker": 2, "factor": 1.5, "start_s": 3.0, "end_s": 9.5}],
        [{"target": "ps", "index": 1, "at_s": 4.0}], kill_mean_s=30.0, kill_target="ps", seed=4)
    assert math.isinf(cfg.faults.stragglers[0].end_s)
    back = load_config(write(tmp_path, cfg.to_toml()))
    assert back == cfg
    assert back.faults.stragglers[0].end_s == math.inf
    assert back.faults.stragglers[1].end_s == 9.5
    assert straggle_factor(back, 0, 1e12) == 2.0


# ------------------------------------------------------------------------------------ staleness

def test_staleness_summary_over_shards():
    # 4 pushes at staleness 0, 2 at 1, 1 at 3 (key types as Ray/JSON may hand them over)
    st = staleness([{"staleness": {0: 3, 2: 1}}, {"staleness": {"0": 1, "1": 2}},
                     {"staleness": {}}])
    assert st["mean"] == pytest.approx((0 * 4 + 1 * 2 + 2 * 1) / 7)
    assert st["max"] == 2
    assert st["p99"] == 2


def test_staleness_p99_ignores_a_rare_tail():
    st = staleness([{"staleness": {0: 990, 7: 10}}, {"staleness": {"50": 1}}])
    assert st == {"mean": pytest.approx((7 * 10 + 50) / 1001), "p99": 7, "max": 50}
    st = staleness([{"staleness": {0: 99, 5: 1}}])
    assert st["p99"] == 0 and st["max"] == 5


def test_staleness_p99_is_an_observed_value():
    st = staleness([{"staleness": {1: 50, 4: 50}}])
    assert st == {"mean": 2.5, "p99": 4, "max": 4}
    st = staleness([{"staleness": {3: 1}}])
    assert st == {"mean": 3.0, "p99": 3, "max": 3}


@pytest.mark.parametrize("stats", [[], [{"staleness": {}}], [{"staleness": {}}] * 3])
def test_staleness_without_pushes_is_none(stats):
    assert staleness(stats) == {"mean": None, "p99": None, "max": None}


def test_per_worker_joins_statuses_with_queue_counts():
    result = {"statuses": [{"rank": 0, "steps": 5, "samples": 50},
                           {"rank": 1, "steps": 2, "samples": 20}],
              "queue": {"by_worker": {"0": {"chunks": 3, "samples": 50}}}}
    assert per_worker(result) == [{"rank": 0, "steps": 5, "samples": 50, "chunks": 3},
                                   {"rank": 1, "steps": 2, "samples": 20, "chunks": 0}]
    assert per_worker({}) == []


@pytest.mark.parametrize("target, recovery", [("worker", "partial"), ("ps", "none")])
def test_a_kill_during_a_checkpoint_write_needs_a_shard_and_recovery(target, recovery):
    kill = {"target": target, "index": 0, "at_s": 1.0, "during": "checkpoint_write"}
    with pytest.raises(ValueError, match=r"faults.kills\[0\].during"):
        RunConfig.model_validate({"mode": "async", "cluster": {"workers": 2, "ps_shards": 2},
                                  "recovery": {"kind": recovery, "checkpoint_every_s": 1.0},
                                  "faults": {"kills": [kill]}})
    ok = RunConfig.model_validate({"mode": "async", "cluster": {"workers": 2, "ps_shards": 2},
                                   "recovery": {"kind": "partial", "checkpoint_every_s": 1.0},
                                   "faults": {"kills": [{**kill, "target": "ps"}]}})
    assert ok.faults.kills[0].during == "checkpoint_write"


# ------------------------------------------------------------------------------- kills at a step

def test_a_kill_is_given_at_a_time_or_at_a_step(tmp_path):
    cfg = run_config(kills=[{"target": "ps", "index": 1, "at_step": 40},
                            {"target": "worker", "index": 0, "at_s": 12.5}])
    assert [(k.at_s, k.at_step, k.when) for k in cfg.faults.kills] == [
        (-1.0, 40, "at_step = 40"), (12.5, -1, "at_s = 12.5")]
    assert load_config(write(tmp_path, cfg.to_toml())) == cfg
    assert load_config(None, ['mode="async"', "cluster.ps_shards=2",
                              'faults.kills=[{target="ps", index=1, at_step=0}]']
                       ).faults.kills[0].when == "at_step = 0"


@pytest.mark.parametrize("when", ["", "at_s = 1.0, at_step = 3", "at_s = -1.0",
                                  "at_step = -2", "at_s = -0.5, at_step = -1"])
def test_a_kill_needs_exactly_one_of_at_s_and_at_step(when):
    kill = "{target = \"ps\", index = 1" + (f", {when}" if when else "") + "}"
    with pytest.raises(ConfigError) as e:
        load_config(None, ['mode="async"', "cluster.ps_shards=2", f"faults.kills=[{kill}]"])
    line = str(e.value).splitlines()[-1]
    assert line.startswith("  faults.kills.0: ")
    assert "a kill of ps 1 needs exactly one of at_s and at_step (>= 0)" in line


def test_a_kill_at_a_step_during_a_checkpoint_write():
    ok = RunConfig.model_validate({
        "mode": "async", "cluster": {"workers": 2, "ps_shards": 2},
        "recovery": {"kind": "partial", "checkpoint_every_s": 1.0},
        "faults": {"kills": [{"target": "ps", "index": 1, "at_step": 7,
                              "during": "checkpoint_write"}]}})
    assert ok.faults.kills[0].when == "at_step = 7"
    with pytest.raises(ValueError, match=r"faults.kills\[0\].during"):
        run_config(kills=[{"target": "ps", "index": 1, "at_step": 7,
                           "during": "checkpoint_write"}])  # recovery off
