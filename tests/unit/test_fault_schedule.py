"""The injected-failure schedule (listed kills plus seeded exponential inter-arrival times) and
how the driver words an actor's death."""

import statistics

import ray

from recsync.config import load_config
from recsync.distributed.faults import death_cause, fault_schedule


def cfg(*extra):
    return load_config(None, ['mode="async"', "cluster.workers=3", "cluster.ps_shards=2", *extra])


def test_listed_kills_come_sorted_by_time():
    c = cfg('faults.kills=[{target="ps", index=1, at_s=9.0}, {target="worker", index=2, at_s=3.0}]')
    assert fault_schedule(c) == [(3.0, "worker", 2), (9.0, "ps", 1)]


def test_rate_kills_are_seeded_and_have_the_configured_mean():
    c = cfg("faults.kill_mean_s=10.0", "faults.seed=4")
    a, b = fault_schedule(c, horizon_s=20_000), fault_schedule(c, horizon_s=20_000)
    assert a == b  # the same schedule in every arm of a benchmark
    gaps = [t2 - t1 for (t1, _, _), (t2, _, _) in zip(a, a[1:])]
    assert 9.0 < statistics.mean(gaps) < 11.0
    assert {target for _, target, _ in a} == {"worker"}
    assert {index for _, _, index in a} == {0, 1, 2}
    other = fault_schedule(cfg("faults.kill_mean_s=10.0", "faults.seed=5"), horizon_s=20_000)
    assert other != a


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
