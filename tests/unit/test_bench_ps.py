"""Scenario `ps` without Ray: its in-process and raw paths measured at a tiny scale, the Ray
path and the saturation curve's runs replaced by fixed figures; the result's shape and the names
the issue's checks read.

Run: python -m pytest tests/unit/test_bench_ps.py
"""

import json

import numpy as np
import pytest
import torch

from recsync.bench import ps, run_scenario
from recsync.embedding.row_optim import RowAdagrad
from test_bench_ps_saturation import PROBE, fake_arm  # tests/unit is on the path

DIRECT_MS = 3.0  # every fake call over the shard's direct path (a worker's)
RAY_MS = 10.0  # every fake Ray call
ECHO_MS = 4.0  # every fake call to the echo actor (Ray's transport alone)
SHARD_CPU_MS = 1.75  # the shard's CPU in every fake direct call


def _fake_ray(rows, calls, warmup):
    points = [ps.point(path, op, n, [ms / 1e3] * calls)
              for path, ms in (("direct", DIRECT_MS), ("ray", RAY_MS), ("ray_echo", ECHO_MS))
              for n in ps.IDS_PER_TABLE for op in ("pull", "push")]
    for p in points:
        if p["path"] == "direct":
            p["shard_cpu_ms_per_call"] = SHARD_CPU_MS
    return points, {"torch_threads": 1, "noop_ms": 0.5, "direct_noop_ms": 0.2,
                    "direct_noop_shard_cpu_ms": 0.125, "ray": "test"}


def _fake_curve(out, scale):
    speeds = dict(zip(ps.saturation.WORKERS, (2000.0, 4000.0, 7900.0, 14800.0, 15000.0)))
    return {"arms": {f"async_{n}w": fake_arm(n, s) for n, s in speeds.items()}, "probe": PROBE,
            "steps": 20, "configs": {"async_1w (recsync config)": 'mode = "async"\n'}}


def test_scenario_ps_times_every_path_op_and_size_and_writes_the_ratios_checks_read(
        monkeypatch, tmp_path):
    monkeypatch.setattr(ps, "through_ray", _fake_ray)
    monkeypatch.setattr(ps.saturation, "measure", _fake_curve)
    r = run_scenario("ps", tmp_path, scale=0.001)
    assert r["scenario"] == "ps"
    at = {(p["path"], p["op"], p["ids_per_table"]): p for p in r["points"]}
    expected = {(path, op, n) for path in ps.PATHS for op in ("pull", "push")
                for n in ps.IDS_PER_TABLE}
    expected |= {("raw_index_add", "push", n) for n in ps.IDS_PER_TABLE}
    assert set(at) == expected
    for p in r["points"]:
        assert p["calls"] == ps.MIN_CALLS
        assert p["rows_per_call"] == 26 * p["ids_per_table"]
        assert p["rows_per_s"] == pytest.approx(p["rows_per_call"] / p["ms_per_call"] * 1e3)
        assert p["ms_min"] <= p["ms_per_call"] <= p["ms_max"]
    ratios = r["ratios"]
    for op in ("pull", "push"):
        # the path a worker's calls take (cluster.transport's default), and Ray actor calls
        assert ratios[f"ray_vs_core_{op}_2048"] == pytest.approx(
            at["core", op, 2048]["ms_per_call"] / DIRECT_MS)
        assert ratios[f"ray_call_vs_core_{op}_2048"] == pytest.approx(
            at["core", op, 2048]["ms_per_call"] / RAY_MS)
        assert ratios[f"transport_share_{op}_2048"] == pytest.approx(ECHO_MS / RAY_MS)
    assert ratios["pull_ms_256"] == pytest.approx(DIRECT_MS)
    assert ratios["ray_call_pull_ms_256"] == pytest.approx(RAY_MS)
    assert set(r["arms"]) == set(ps.PATHS) | {f"async_{n}w" for n in ps.saturation.WORKERS}
    assert ratios["workers_per_shard_at_90pct"] == 8
    assert r["arms"]["ray"]["pull_ms_per_call"]["256"] == pytest.approx(RAY_MS)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["ratios"]["ray_vs_core_push_2048"] == pytest.approx(
        ratios["ray_vs_core_push_2048"])
    report = (tmp_path / "report.md").read_text()
    assert "PSShard, direct path" in report and "PSShard via Ray calls" in report and "16,384 (425,984)" in report
    assert "EMULATED" in report and "saturation.png" in report
    assert (tmp_path / "saturation.png").exists()
    cpu = next(rows for name, rows in r["tables"].items() if "shard's CPU per call" in name)
    assert cpu[0] == ["pull of no ids", 0.125, 0.2]
    assert len(cpu) == 1 + 2 * len(ps.IDS_PER_TABLE)
    assert all(row[1:] == [SHARD_CPU_MS, DIRECT_MS] for row in cpu[1:])


def test_the_shards_cpu_per_call_is_read_around_the_timed_calls_only(monkeypatch):
    """measure_path's ``cpu`` (the shard process's CPU so far) is read after the warm-up and
    after the timed calls: the warm-up's CPU (here ten times a timed call's) is not in it."""
    monkeypatch.setattr(ps, "IDS_PER_TABLE", (8,))
    used, made = [0.0], [0]

    def call(ids, grads):
        made[0] += 1
        used[0] += 0.010 if made[0] <= 2 else 0.001

    (p,) = ps.measure_path("direct", {"pull": call}, rows=100, calls=5, warmup=2,
                           cpu=lambda: used[0])
    assert p["calls"] == 5 and p["shard_cpu_ms_per_call"] == pytest.approx(1.0)
    assert ps.cpu_per_call_ms(None, 1.0, 5) is None


def test_a_process_cpu_is_read_from_proc_and_grows_as_it_works():
    import os
    before = ps.process_cpu_s(os.getpid())
    sum(i * i for i in range(300_000))
    assert before is not None and ps.process_cpu_s(os.getpid()) > before
    assert ps.process_cpu_s(2**22 + 12_345) is None  # (beyond Linux's largest pid)


def test_the_raw_push_is_the_row_wise_adagrad_a_shard_applies():
    rows, n = 1000, 300
    raw = ps.RawTables(rows, lr=0.05)
    weights = [w.clone() for w in raw.weights]
    state = [s.clone() for s in raw.state]
    rng = np.random.default_rng(1)
    ids = ps.random_ids(rng, rows, n)
    grads = [rng.standard_normal((n, ps.DIM), dtype=np.float32) for _ in ids]
    raw.push_adagrad(ids, grads)
    rule = RowAdagrad(lr=0.05)
    for t in (0, 25):
        rule.apply_to_table(weights[t], state[t], torch.from_numpy(ids[t]),
                            torch.from_numpy(grads[t]))
        torch.testing.assert_close(raw.weights[t], weights[t])
        torch.testing.assert_close(raw.state[t], state[t])


def test_the_timed_core_has_every_row_touched_and_applies_pushes_at_once():
    core = ps.touched_core(ps.table_specs(70_000), ps.shard_config())
    assert core.store.num_initialized() == 26 * 70_000
    assert core.mode == "async" and type(core.store.optimizer) is RowAdagrad
    ids = [np.array([3, 69_999], np.int64)] * 26
    core.push(ids, [np.ones((2, ps.DIM), np.float32)] * 26, None, dict(ps.PUSH_META))
    assert core.version == 1
