"""The simulated clock and the model of time (recsync/simulation/clock.py, timing.py), without a
model or data."""

from __future__ import annotations

import json

import pytest
import torch

from recsync.simulation.client import SimGroup
from recsync.simulation.clock import Clock, Deadlock, Future
from recsync.simulation.timing import Speeds, Timing


def test_processes_run_in_the_order_of_simulated_time():
    clock, seen = Clock(), []

    def worker(name, step_s, steps):
        def run():
            for i in range(steps):
                clock.sleep(step_s)
                seen.append((clock.now, name, i))
        return run

    clock.spawn(worker("slow", 2.0, 3), "slow")
    clock.spawn(worker("fast", 1.0, 5), "fast")
    clock.run()
    assert [t for t, _, _ in seen] == sorted(t for t, _, _ in seen)
    assert [(t, n) for t, n, _ in seen if n == "slow"] == [(2.0, "slow"), (4.0, "slow"),
                                                           (6.0, "slow")]
    assert clock.now == 6.0


def test_a_future_wakes_its_waiter_when_an_event_resolves_it():
    clock, got = Clock(), []
    future = Future(clock)

    def waiter():
        got.append((clock.wait(future), clock.now))

    clock.spawn(waiter, "waiter")
    clock.at(3.5, lambda: future.resolve("answer"))
    clock.run()
    assert got == [("answer", 3.5)]


def test_an_error_in_a_process_reaches_the_caller():
    clock = Clock()

    def broken():
        clock.sleep(1.0)
        raise ValueError("bad step")

    clock.spawn(broken, "w")
    with pytest.raises(ValueError, match="bad step"):
        clock.run()


def test_a_process_that_waits_for_nothing_is_a_deadlock():
    clock = Clock()
    clock.spawn(lambda: clock.wait(Future(clock)), "stuck worker")
    with pytest.raises(Deadlock, match="stuck worker"):
        clock.run()


def test_the_all_reduce_sums_and_returns_when_the_last_member_arrived():
    timing = Timing(compute_s=0.0, collective_latency_s=0.001, bytes_per_s=1e12)
    clock = Clock()
    group = SimGroup(clock, 3, timing)
    out = {}

    def member(rank):
        def run():
            clock.sleep(float(rank))  # rank 2 arrives last, at 2 s
            t = torch.full((4,), float(rank + 1))
            group.all_reduce(t)
            out[rank] = (t.tolist(), clock.now)
        return run

    for r in range(3):
        clock.spawn(member(r), f"w{r}")
    clock.run()
    expected_end = 2.0 + timing.all_reduce_s(16, 3)
    for r in range(3):
        assert out[r][0] == [6.0] * 4
        assert out[r][1] == pytest.approx(expected_end)
    assert group.rounds == 1 and group.waited_s == pytest.approx(2.0 + 1.0)


def test_speeds_stragglers_slow_the_share_asked_within_the_factors():
    factors = Speeds(kind="stragglers", share=0.1, low=2.0, high=5.0, seed=3).schedule(
        200).initial()
    slow = [f for f in factors if f > 1.0]
    assert len(slow) == 20 and all(2.0 <= f <= 5.0 for f in slow)
    assert Speeds(kind="constant").schedule(5).initial() == [1.0] * 5


def test_a_trace_gives_each_worker_its_factor_over_time(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([1.5, [[10.0, 3.0], [20.0, 1.0]]]))
    speeds = Speeds(kind="trace", trace=str(path)).schedule(2)
    assert speeds.factor(0, 100.0) == 1.5
    assert [speeds.factor(1, t) for t in (0.0, 10.0, 15.0, 25.0)] == [1.0, 3.0, 3.0, 1.0]
    with pytest.raises(ValueError, match="one entry per worker"):
        Speeds(kind="trace", trace=str(path)).schedule(3)


def test_bad_timing_values_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="latency_s"):
        Timing(latency_s=-1.0)
    with pytest.raises(ValueError, match="speeds.kind"):
        Speeds(kind="gamma")
    with pytest.raises(ValueError, match="speeds.low"):
        Speeds(kind="stragglers", low=0.5)


def test_call_costs_follow_the_configs_transport_and_keep_costs_set_by_hand():
    """A simulated run models the calls its config would make: the direct path's measured
    costs by default (a call's service at the shard its measured CPU there, a call without
    rows' round trip its latency both ways and its CPU), Ray calls' (each dearer, from their
    wall times) with cluster.transport = "ray"."""
    from recsync.simulation.timing import DIRECT, MEASURED_CALLS, MEASURED_SHARD_CPU, RAY
    direct = Timing()
    assert direct.on("direct") is direct
    bare_cpu_s, (rows, pull_s), (_, push_s) = MEASURED_SHARD_CPU["direct"]  # bench ps's
    assert direct.pull_service_s(0) == direct.push_service_s(0) == pytest.approx(bare_cpu_s)
    assert direct.pull_service_s(rows) == pytest.approx(pull_s)  # 256 ids x 26 tables
    assert direct.push_service_s(rows) == pytest.approx(push_s)
    assert 2 * direct.latency_s + bare_cpu_s == pytest.approx(MEASURED_CALLS["direct"][0])
    on_ray = direct.on("ray")
    _, (rows, measured_s) = MEASURED_CALLS["ray"][2]  # and Ray calls' push of 2,048 ids x 26
    assert on_ray.push_service_s(rows) + 2 * on_ray.latency_s == pytest.approx(measured_s)
    for name in DIRECT:
        assert getattr(on_ray, name) == RAY[name]
    for rows in (0, 6_656):  # a Ray call costs more than a direct one, with or without rows
        assert (on_ray.pull_service_s(rows) + 2 * on_ray.latency_s
                > direct.pull_service_s(rows) + 2 * direct.latency_s)
        assert (on_ray.push_service_s(rows) + 2 * on_ray.latency_s
                > direct.push_service_s(rows) + 2 * direct.latency_s)
    assert Timing(latency_s=0.01).on("ray").latency_s == 0.01  # --latency-ms stays


def test_on_one_core_holds_the_thread_and_its_new_threads_to_one_core_then_restores():
    import os
    import threading

    from recsync.simulation.clock import on_one_core
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    seen = []
    with on_one_core():
        inside = os.sched_getaffinity(0)
        t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        t.start()
        t.join()
    assert inside == {min(before)} and seen == [inside]
    assert os.sched_getaffinity(0) == before


def test_a_shards_background_cpu_since_its_last_call_lengthens_the_next_calls_service():
    """As the EMULATED pacer charges a shard's CPU by the second to the call that ends next:
    a call that comes 11 s after the previous one is served 11 x shard_background longer, the
    first call only its own cost."""
    from types import SimpleNamespace

    from recsync.simulation.shards import SimShard
    clock, done = Clock(), []
    core = SimpleNamespace(version=0, pull=lambda ids, read_only, dense: [])
    timing = Timing(latency_s=0.0, pull_call_s=1.0, pull_s_per_row=0.0, shard_background=0.1)
    shard = SimShard(clock, core, timing)

    def caller():
        for pause in (0.0, 10.0):
            clock.sleep(pause)
            start = clock.now
            clock.wait(shard.pull.remote([]))
            done.append(clock.now - start)

    clock.spawn(caller, "worker")
    clock.run()
    # the second call came 11 s after the first (its 1 s of service, then 10 s)
    assert done == pytest.approx([1.0, 1.0 + 0.1 * 11.0])
    assert shard.busy_s == pytest.approx(2.0 + 1.1)
    with pytest.raises(ValueError, match="shard_background"):
        Timing(shard_background=-0.1)
