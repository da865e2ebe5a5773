"""Modes shadow and foreground on the simulated clock (recsync/simulation/rounds.py): the rounds
of the real synchronizers, in the shadow thread's own process or inside training. No Ray."""

from __future__ import annotations

import pytest
import torch

import recsync.simulation.run as sim_run
from recsync.simulation.run import simulate
from test_simulate_run import BATCH, ROWS, config, data, free_network, one_thread  # noqa: F401

STEPS = ROWS // BATCH  # one chunk of one batch each


@pytest.fixture
def clusters(monkeypatch):
    """The simulated clusters of the runs of this test, to read their trainers' replicas."""
    made = []

    class Kept(sim_run.Cluster):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(sim_run, "Cluster", Kept)
    return made


@pytest.mark.parametrize("mode", ["shadow", "foreground"])
@pytest.mark.parametrize("algorithm", ["ma", "bmuf"])
def test_the_last_round_leaves_every_trainer_with_the_same_replica(data, tmp_path, clusters,
                                                                   mode, algorithm):
    cfg = config(data, mode, 3, **{"shadow.algorithm": algorithm})
    s = simulate(cfg, tmp_path / "out", timing=free_network(collective_latency_s=1e-3))
    replicas = [w.mode.replica.vector() for w in clusters[-1].workers]
    # equal but for rounding (each moved its own replica by mean - snapshot)
    assert all(torch.allclose(r, replicas[0], rtol=0, atol=1e-6) for r in replicas[1:])
    assert s["samples"] == ROWS and all(n > 0 for n in s["shadow"]["syncs"])
    # every trainer took part in the same rounds, the last ones after its training
    rounds = [a + b for a, b in zip(s["shadow"]["syncs"], s["shadow"]["final_syncs"])]
    assert len(set(rounds)) == 1 and all(n >= 1 for n in s["shadow"]["final_syncs"])
    assert s["shadow"]["threads_left_running"] == 0


def test_background_rounds_take_no_time_from_training_and_foreground_rounds_do(data, tmp_path):
    """Two trainers in step, an all-reduce of 10 ms: the shadow thread's rounds leave training
    as it is without rounds; a foreground round after every step adds the all-reduce to it."""
    timing = free_network(collective_latency_s=0.005)  # ring of 2: 2 messages of 5 ms
    runs = {name: simulate(config(data, mode, 2, **{"shadow.algorithm": alg,
                                                    "shadow.foreground_every": 1}),
                           tmp_path / name, timing=timing)
            for name, mode, alg in [("none", "shadow", "none"), ("shadow", "shadow", "ma"),
                                    ("foreground", "foreground", "ma")]}
    trained = {name: [w["finished_s"] for w in s["simulated"]["per_worker"]]
               for name, s in runs.items()}
    assert trained["shadow"] == trained["none"]
    rounds = runs["foreground"]["shadow"]["syncs"]
    assert rounds == [STEPS // 2, STEPS // 2]
    for fg, none in zip(trained["foreground"], trained["none"]):
        assert fg == pytest.approx(none + STEPS // 2 * 0.010, rel=1e-6)


def test_shadow_rounds_start_at_least_min_interval_apart(data, tmp_path):
    cfg = config(data, "shadow", 2, **{"shadow.min_interval_s": 0.05})
    s = simulate(cfg, tmp_path / "out", timing=free_network(collective_latency_s=1e-3))
    train_s = max(w["finished_s"] for w in s["simulated"]["per_worker"])  # 100 steps x 10 ms
    for n in s["shadow"]["syncs"]:
        assert train_s / 0.05 <= n <= train_s / 0.05 + 1


def test_a_round_that_takes_no_time_waits_for_a_training_step(data, tmp_path):
    """One trainer (an all-reduce of one costs nothing) and no least interval: the shadow
    thread syncs once per training step instead of never letting the time move on."""
    cfg = config(data, "shadow", 1, **{"shadow.min_interval_s": 0.0})
    s = simulate(cfg, tmp_path / "out", timing=free_network())
    assert s["samples"] == ROWS
    assert STEPS - 1 <= s["shadow"]["syncs"][0] <= STEPS + 1


@pytest.mark.parametrize("mode", ["shadow", "foreground"])
def test_easgd_rounds_exchange_with_the_center_on_shard_0(data, tmp_path, clusters, mode):
    """Each round is one call to shard 0 (its messages and its service time); the center it
    moves is the run's final model."""
    timing = free_network(push_call_s=0.002)
    s = simulate(config(data, mode, 2, **{"shadow.algorithm": "easgd"}), tmp_path / "out",
                 timing=timing)
    rounds = sum(s["shadow"]["syncs"]) + sum(s["shadow"]["final_syncs"])
    rule = clusters[-1].cores[0].rule
    assert rounds > 0 and rule.pushes == rounds
    pushes = clusters[-1].cores[0].stats()["pushes"]
    assert clusters[-1].shards[0].busy_s == pytest.approx(0.002 * (pushes + rounds))
    center = rule.center
    dense = clusters[-1].dense_now()
    assert center.equal(torch.cat([p.detach().reshape(-1) for p in dense.parameters()]))
