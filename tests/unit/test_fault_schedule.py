"""The injected-failure schedule (listed kills plus seeded exponential inter-arrival times),
carrying it out, and how the driver words an actor's death."""

import statistics
import time
from types import SimpleNamespace

import ray

from recsync.config import load_config
from recsync.distributed.faults import FaultInjector, death_cause, fault_schedule
from recsync.run.record import RunRecord


def points(kills):
    """(at_s, target, index) of kills at a time."""
    assert all(k.at_step == -1 for k in kills)
    return [(k.at_s, k.target, k.index) for k in kills]


def cfg(*extra):
    return load_config(None, ['mode="async"', "cluster.workers=3", "cluster.ps_shards=2", *extra])


def test_listed_kills_come_sorted_by_time():
    c = cfg('faults.kills=[{target="ps", index=1, at_s=9.0}, {target="worker", index=2, at_s=3.0}]')
    assert points(fault_schedule(c)) == [(3.0, "worker", 2), (9.0, "ps", 1)]


def test_rate_kills_are_seeded_and_have_the_configured_mean():
    c = cfg("faults.kill_mean_s=10.0", "faults.seed=4")
    a, b = points(fault_schedule(c, horizon_s=20_000)), points(fault_schedule(c, horizon_s=20_000))
    assert a == b  # the same schedule in every arm of a benchmark
    gaps = [t2 - t1 for (t1, _, _), (t2, _, _) in zip(a, a[1:])]
    assert 9.0 < statistics.mean(gaps) < 11.0
    assert {target for _, target, _ in a} == {"worker"}
    assert {index for _, _, index in a} == {0, 1, 2}
    other = points(fault_schedule(cfg("faults.kill_mean_s=10.0", "faults.seed=5"),
                                  horizon_s=20_000))
    assert other != a


def test_any_target_kills_workers_and_shards_alike():
    a = points(fault_schedule(cfg("faults.kill_mean_s=10.0", "faults.seed=4",
                                  'faults.kill_target="any"'), horizon_s=20_000))
    assert a == points(fault_schedule(cfg("faults.kill_mean_s=10.0", "faults.seed=4",
                                          'faults.kill_target="any"'), horizon_s=20_000))
    procs = [(target, index) for _, target, index in a]
    assert set(procs) == {("worker", 0), ("worker", 1), ("worker", 2), ("ps", 0), ("ps", 1)}
    workers = sum(1 for target, _ in procs if target == "worker")
    assert 0.5 < workers / len(procs) < 0.7  # 3 of the 5 processes are workers
    gaps = [t2 - t1 for (t1, _, _), (t2, _, _) in zip(a, a[1:])]
    assert 9.0 < statistics.mean(gaps) < 11.0


class KillLog:
    """The run's verbs the injector uses; a killed process stays down until ``back``."""

    def __init__(self):
        self.record, self.down, self.killed = RunRecord(), set(), []
        self.tallies = SimpleNamespace(start_unix=time.time() - 3.0)

    def kill(self, target, index):
        self.down.add((target, index))
        self.killed.append((target, index))

    def is_down(self, target, index):
        return (target, index) in self.down

    def kill_in_next_write(self, index):
        self.killed.append(("ps in its next write", index))


def test_a_kill_waits_while_its_process_is_down_and_the_others_go_ahead():
    c = cfg('faults.kills=[{target="ps", index=1, at_s=1.0}, {target="ps", index=1, at_s=2.0}, '
            '{target="worker", index=0, at_s=2.5}, {target="ps", index=1, at_s=9.0}]')
    injector, run = FaultInjector(c), KillLog()
    injector.inject_due(run, 3.0, 0)  # shard 1 twice: the second waits until it is back
    assert run.killed == [("ps", 1), ("worker", 0)]
    injector.inject_due(run, 4.0, 0)
    assert len(run.killed) == 2
    run.down.discard(("ps", 1))  # recovered
    injector.inject_due(run, 5.0, 0)
    assert run.killed[2:] == [("ps", 1)]
    assert [(e["event"], e["target"], e["index"], e["emulated"]) for e in run.record.events] \
        == [("killed ps 1", "ps", 1, True), ("killed worker 0", "worker", 0, True),
            ("killed ps 1", "ps", 1, True)]
    # logged when made (since start_unix: 3 s before the test began), not when due
    assert all(3.0 <= e["time_s"] < 60.0 for e in run.record.events)
    assert points(injector.kills) == [(9.0, "ps", 1)]


def test_no_faults_no_schedule():
    assert fault_schedule(cfg()) == []


class FakeActorError(ray.exceptions.RayActorError):
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


def test_a_constructor_error_is_named_and_a_crash_is_a_death():
    started = FakeActorError(
        "The actor died because of an error raised in its creation task, ray::PSShard\n"
        "  File \"dist_driver.py\", line 59, in _make_core\n"
        "AttributeError: 'RunConfig' object has no attribute 'gba'\n")
    assert death_cause(started) == ("failed to start: AttributeError: 'RunConfig' object has "
                                     "no attribute 'gba'")
    assert death_cause(FakeActorError("The actor is dead because its worker process has died."))\
        == "died"
    assert death_cause(ray.exceptions.GetTimeoutError()) == "does not answer (5 s)"


def test_a_kill_during_a_checkpoint_write_is_armed_when_due_and_logged_as_such():
    c = cfg('recovery.kind="partial"', "recovery.checkpoint_every_s=1",
            'faults.kills=[{target="ps", index=1, at_s=1.0, '
            'during="checkpoint_write"}, {target="ps", index=0, at_s=1.5}]')
    injector, run = FaultInjector(c), KillLog()
    injector.inject_due(run, 2.0, 0)
    assert run.killed == [("ps in its next write", 1), ("ps", 0)]
    assert [e["event"] for e in run.record.events] == [
        "armed: ps 1 exits in its next checkpoint write", "killed ps 0"]
    assert run.record.events[0]["during"] == "checkpoint_write" and injector.kills == []


def test_a_kill_at_a_step_fires_once_the_most_advanced_worker_has_done_that_step():
    c = cfg('faults.kills=[{target="worker", index=1, at_step=40}, {target="ps", index=0, '
            'at_s=2.0}, {target="ps", index=1, at_step=10}]')
    injector, run = FaultInjector(c), KillLog()
    assert [k.when for k in injector.kills] == ["at_s = 2", "at_step = 10", "at_step = 40"]
    injector.inject_due(run, 100.0, 9)  # no time makes a step kill due
    assert run.killed == [("ps", 0)]
    injector.inject_due(run, 100.0, 10)
    assert run.killed == [("ps", 0), ("ps", 1)]
    injector.inject_due(run, 101.0, 39)
    assert len(run.killed) == 2
    run.down.clear()  # every process back: nothing fires twice
    injector.inject_due(run, 102.0, 45)
    injector.inject_due(run, 103.0, 50)
    assert run.killed == [("ps", 0), ("ps", 1), ("worker", 1)] and injector.kills == []
    assert [(e["event"], e["scheduled"]) for e in run.record.events] == [
        ("killed ps 0", "at_s = 2"), ("killed ps 1", "at_step = 10"),
        ("killed worker 1", "at_step = 40")]


def test_a_kill_at_a_step_waits_while_its_process_is_down():
    c = cfg('faults.kills=[{target="ps", index=1, at_s=1.0}, {target="ps", index=1, at_step=5}]')
    injector, run = FaultInjector(c), KillLog()
    injector.inject_due(run, 2.0, 7)
    assert run.killed == [("ps", 1)] and [k.when for k in injector.kills] == ["at_step = 5"]
    run.down.clear()
    injector.inject_due(run, 3.0, 8)
    assert run.killed == [("ps", 1), ("ps", 1)] and injector.kills == []


def test_a_kill_during_a_checkpoint_write_is_armed_at_its_step():
    c = cfg('recovery.kind="partial"', "recovery.checkpoint_every_s=1",
            'faults.kills=[{target="ps", index=1, at_step=20, during="checkpoint_write"}]')
    injector, run = FaultInjector(c), KillLog()
    injector.inject_due(run, 50.0, 19)
    assert run.killed == [] and run.record.events == []
    injector.inject_due(run, 50.5, 20)
    injector.inject_due(run, 51.0, 30)
    assert run.killed == [("ps in its next write", 1)] and injector.kills == []
    assert [(e["event"], e["during"], e["scheduled"]) for e in run.record.events] == [
        ("armed: ps 1 exits in its next checkpoint write", "checkpoint_write", "at_step = 20")]


def test_listed_and_random_kills_together():
    c = cfg('faults.kills=[{target="ps", index=1, at_step=3}, {target="worker", index=0, '
            'at_s=5.0}]', "faults.kill_mean_s=10.0", "faults.seed=4")
    kills = fault_schedule(c, horizon_s=60.0)
    timed = [k for k in kills if k.at_s >= 0]
    assert kills[-1].when == "at_step = 3" and len(timed) == len(kills) - 1 >= 2
    assert [k.at_s for k in timed] == sorted(k.at_s for k in timed)
    assert ("worker", 0, 5.0) in [(k.target, k.index, k.at_s) for k in timed]
