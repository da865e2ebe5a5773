"""The EMULATED cluster's pacing arithmetic (recsync/cluster/emulation.py) on a fake clock, and the
config's refusal of an emulated cluster larger than the machine."""

import asyncio

import pytest

from recsync.cluster.emulation import (EmulatedMachine, RequestPacer, StepPacer, cluster_label,
                                       idle_cores, shard_entry, worker_entry)
from recsync.config import ConfigError, load_config


class FakeClock:
    """Wall and CPU clocks that move only when told: ``work(s)`` burns s seconds of CPU (and
    as much wall time, as an uncontended core would), ``wait(s)`` passes wall time only."""

    def __init__(self):
        self.now = 100.0
        self.cpu = 0.0
        self.slept: list[float] = []

    def work(self, s: float) -> None:
        self.now += s
        self.cpu += s

    def wait(self, s: float) -> None:
        self.now += s

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def machine(self, cores: float) -> EmulatedMachine:
        return EmulatedMachine(cores, clock=lambda: self.now, cpu_clock=lambda: self.cpu)


def test_a_section_lasts_its_cpu_time_over_the_cores():
    clock = FakeClock()
    m = clock.machine(0.25)
    section = m.open()
    clock.work(0.1)
    wait, charged = m.close(section)
    assert wait == pytest.approx(0.3)  # 0.1 / 0.25 = 0.4 s, 0.1 s already passed
    assert charged == pytest.approx(0.1)
    assert m.totals()["service_s"] == pytest.approx(0.4)


def test_sections_of_one_machine_run_one_after_another():
    """Two threads' sections started together on a 0.5-core machine: the second is due after
    the first one's emulated time plus its own, as the machine's cores are shared; each is
    charged the process's CPU time since the previous section ended."""
    clock = FakeClock()
    m = clock.machine(0.5)
    a, b = m.open(), m.open()
    clock.work(0.1)
    wait_a, _ = m.close(a)  # due at 0.2
    clock.cpu += 0.1  # b's work (on another core: no wall time passes)
    wait_b, charged_b = m.close(b)  # due at 0.2 + 0.2
    assert charged_b == pytest.approx(0.1)
    assert wait_a == pytest.approx(0.1)
    assert wait_b == pytest.approx(0.3)


def test_waiting_inside_a_section_counts_as_time_passed_and_slow_work_is_late():
    clock = FakeClock()
    m = clock.machine(1.0)
    s = m.open()
    clock.wait(0.5)  # e.g. a pull waiting for the previous step
    clock.work(0.1)
    assert m.close(s) == (0.0, pytest.approx(0.1))  # 0.6 s passed, 0.1 s of work: no wait
    assert m.totals()["late_s"] == pytest.approx(0.5)
    clock.cpu += 0.02  # work after the last section (another thread's): not paced yet
    assert m.totals()["unpaced_cpu_s"] == pytest.approx(0.02)


def test_a_straggler_step_is_paced_at_its_factor_and_its_gradients_leave_late():
    clock = FakeClock()
    pacer = StepPacer(clock.machine(0.25), sleep=clock.sleep)
    pacer.begin()
    clock.work(0.01)  # the pull's own work
    pacer.point(4.0)
    clock.work(0.05)  # forward and backward
    slept = pacer.point(4.0, compute=True)  # the gradients leave after this
    assert slept == pytest.approx(4.0 * 0.05 / 0.25 - 0.05)
    assert clock.now == pytest.approx(100.0 + 16 * 0.06)  # both sections paced 16x
    clock.work(0.01)  # the push
    pacer.end(4.0)
    t = pacer.totals()
    assert t["steps"] == 1
    assert t["cpu_s"] == pytest.approx(0.07)
    assert t["paced_wall_s"] == pytest.approx(16 * 0.07)
    entry = worker_entry(0, t)
    assert entry["compute_wall_per_cpu"] == pytest.approx(16.0)
    assert entry["expected"] == pytest.approx(16.0)
    # the CPU before the compute (the pull's side) and of the compute, apart from the push's
    assert (entry["pre_compute_cpu_s"], entry["compute_cpu_s"]) == (pytest.approx(0.01),
                                                                   pytest.approx(0.05))


def test_a_step_without_a_compute_section_charges_nothing_before_a_compute():
    """A step of begin and end only (sync's all-reduce of an idle worker; a shadow round): its
    CPU is the step's, none of it counted as the pull's side of a step."""
    clock = FakeClock()
    pacer = StepPacer(clock.machine(0.5), sleep=clock.sleep)
    pacer.begin()
    clock.work(0.02)
    pacer.end(count=False)
    assert pacer.totals()["cpu_s"] == pytest.approx(0.02)
    assert pacer.totals()["pre_compute_cpu_s"] == 0.0


def test_steps_without_a_straggler_keep_one_over_the_cores():
    clock = FakeClock()
    pacer = StepPacer(clock.machine(0.5), sleep=clock.sleep)
    for _ in range(3):
        pacer.begin()
        clock.work(0.02)
        pacer.point(compute=True)
        pacer.end()
    entry = worker_entry(1, StepPacer.summed([pacer]))
    assert entry["pull_s"] is None  # no pulls timed
    assert worker_entry(1, {**StepPacer.summed([pacer]), "pull_round_trip_s": 0.03,
                            "pulls_timed": 3})["pull_s"] == pytest.approx(0.01)
    assert entry["steps"] == 3
    assert entry["compute_wall_per_cpu"] == pytest.approx(2.0)
    assert entry["wall_per_cpu"] == pytest.approx(2.0)


def test_a_shard_answers_requests_at_its_emulated_pace():
    clock = FakeClock()

    async def sleep(s):
        clock.sleep(s)

    pacer = RequestPacer(clock.machine(0.25), sleep=sleep)

    async def serve():
        first, second = pacer.start(), pacer.start()  # both arrived now
        clock.work(0.01)
        await pacer.finish(first)  # answered at 0.04
        clock.cpu += 0.01  # the second one's work, done while the first one waited
        await pacer.finish(second)  # answered at 0.08

    asyncio.run(serve())
    assert clock.now == pytest.approx(100.08)
    entry = shard_entry(0, pacer.machine.totals(), 0.25)
    assert entry["requests"] == 2
    assert entry["wall_per_cpu"] == pytest.approx(4.0)


def test_the_label_names_the_emulated_machines():
    assert cluster_label(4, 0.25, 2, 0.25) == \
        "EMULATED cluster: 4 workers x 0.25 cores, 2 shards x 0.25 cores"


def test_an_emulated_cluster_larger_than_the_machine_is_refused_with_the_numbers(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    base = ['mode="sync"', "cluster.workers=4", "cluster.ps_shards=2"]
    cfg = load_config(None, [*base, "emulation.cores_per_worker=0.25",
                             "emulation.cores_per_shard=0.25"])  # 1.5 of 2 - 0.5
    assert cfg.emulation.enabled
    with pytest.raises(ConfigError, match=r"4 workers x 0.5 cores \+ 2 shards x 0.25 cores = "
                                          r"2.5 cores, more than this machine's 2 cores"):
        load_config(None, [*base, "emulation.cores_per_worker=0.5",
                           "emulation.cores_per_shard=0.25"])
    with pytest.raises(ConfigError, match="mode \"local\" has none"):
        load_config(None, ["emulation.cores_per_worker=0.25", "emulation.cores_per_shard=0.25"])


def test_a_shadow_thread_with_cores_of_its_own_does_not_slow_its_trainer():
    """``emulation.cores_per_shadow``: the rounds' CPU is paid on the shadow thread's machine
    and taken off the trainer's account, even when a trainer's section closed in the middle
    of a round (it paid for part of the round; its next sections pay that back)."""
    clock = FakeClock()
    shadow_cpu = [0.0]  # the shadow thread's own CPU clock
    shadow = EmulatedMachine(0.125, clock=lambda: clock.now, cpu_clock=lambda: shadow_cpu[0])
    trainer = EmulatedMachine(0.25, clock=lambda: clock.now,
                              cpu_clock=lambda: clock.cpu - shadow.cpu_s)
    step, rnd = trainer.open(), shadow.open()
    clock.work(0.1)  # the step's compute
    clock.cpu += 0.02  # half of a round, on the other core
    shadow_cpu[0] += 0.02
    wait, charged = trainer.close(step)  # the round is not over: charged to the trainer
    assert charged == pytest.approx(0.12)
    clock.sleep(wait)
    clock.cpu += 0.02  # the round's second half
    shadow_cpu[0] += 0.02
    _, round_cpu = shadow.close(rnd)
    assert round_cpu == pytest.approx(0.04)
    assert shadow.totals()["service_s"] == pytest.approx(0.04 / 0.125)
    step = trainer.open()
    clock.work(0.01)  # a small section: less CPU than the trainer paid of the round
    _, charged = trainer.close(step)
    assert charged == 0.0
    step = trainer.open()
    clock.work(0.1)
    _, charged = trainer.close(step)  # pays back the rest of the round's 0.02
    assert charged == pytest.approx(0.09)
    assert trainer.totals()["cpu_s"] == pytest.approx(0.21)  # the trainer's own work alone


def test_the_shadow_threads_cores_are_labelled_counted_and_only_for_mode_shadow(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert cluster_label(4, 0.125, 2, 0.375, 0.0625) == (
        "EMULATED cluster: 4 workers x 0.125 cores (+ 0.0625 for the shadow thread), "
        "2 shards x 0.375 cores")
    base = ['mode="shadow"', "cluster.workers=4", "cluster.ps_shards=2",
            "emulation.cores_per_worker=0.125", "emulation.cores_per_shard=0.375"]
    load_config(None, [*base, "emulation.cores_per_shadow=0.0625"])  # 1.5 of 2 - 0.5
    with pytest.raises(ConfigError, match=r"4 workers x 0.25 cores \+ 2 shards x 0.375 cores"):
        load_config(None, [*base, "emulation.cores_per_shadow=0.125"])
    with pytest.raises(ConfigError, match="only mode \"shadow\" has a shadow thread"):
        load_config(None, [*base[1:], 'mode="foreground"', "emulation.cores_per_shadow=0.0625"])


def test_the_process_idle_cpu_is_not_charged_to_the_next_section():
    """Ray's threads use CPU while a shard waits for requests (measured before training): a
    request after 2 s of waiting is charged its own work only, not the 2 s x the idle rate."""
    clock = FakeClock()
    m = clock.machine(0.1)
    m.set_idle(0.03)
    first = m.open()
    clock.work(0.01)
    m.close(first)
    clock.wait(2.0)
    clock.cpu += 0.06  # idle: 0.03 cores x 2 s
    section = m.open()
    clock.work(0.01)
    wait, charged = m.close(section)
    assert charged == pytest.approx(0.01 - 0.03 * 0.01, abs=1e-9)  # the idle rate meanwhile too
    assert m.totals()["idle_cpu_s"] == pytest.approx(0.06 + 0.03 * 0.02, abs=1e-9)
    assert m.totals()["idle_cores"] == 0.03


def test_without_an_idle_measurement_every_cpu_second_is_charged():
    clock = FakeClock()
    m = clock.machine(0.1)
    m.open()
    clock.wait(2.0)
    clock.cpu += 0.06
    section = m.open()
    clock.work(0.01)
    _, charged = m.close(section)
    assert charged == pytest.approx(0.07)


def test_idle_cpu_is_taken_at_most_at_half_the_machine():
    """A measurement disturbed by real work must not make the machine free of charge."""
    m = FakeClock().machine(0.1)
    m.set_idle(0.2)
    assert m.idle_cores == pytest.approx(0.05) and m.idle_measured == 0.2


def test_idle_cores_measures_this_process_doing_nothing():
    assert 0.0 <= idle_cores(0.05) < 0.5  # the test process's other threads are quiet
