"""The mode controller: switches to gba when a straggler persists, back to sync when it is gone,
and never on a blip shorter than the window."""

from recsync.config import SwitchingConfig
from recsync.modes.controller import ModeController


def feed(ctl, mode, start_s, end_s, compute_per_step, poll_s=0.5):
    """Poll every ``poll_s`` with each worker doing one step of the given compute time."""
    t = start_s
    while t < end_s:
        decision = ctl.observe(t, mode, list(compute_per_step), [1] * len(compute_per_step))
        if decision:
            return t, decision
        t += poll_s
    return None


def test_a_persistent_straggler_switches_to_gba_after_the_window_and_back_when_gone():
    ctl = ModeController(SwitchingConfig(auto=True, ratio=1.5, window_s=3.0))
    assert feed(ctl, "sync", 0.0, 10.0, [0.1, 0.1, 0.1, 0.1]) is None  # nobody slow
    t, (to, cause) = feed(ctl, "sync", 10.0, 30.0, [0.4, 0.1, 0.1, 0.1])
    assert to == "gba" and "worker 0" in cause and "4.00x" in cause
    # the smoothed ratio crosses the threshold within a poll or two, then the window runs
    assert 13.0 <= t <= 14.5
    t, (to, cause) = feed(ctl, "gba", 20.0, 40.0, [0.1, 0.1, 0.1, 0.1])
    assert to == "sync" and "under 1.5" in cause and 23.0 <= t <= 25.5


def test_a_blip_shorter_than_the_window_does_not_switch():
    """The ratio is taken over the last 2 s of polls, which stretches a 1 s blip to ~2.5 s:
    still shorter than the 3 s window."""
    ctl = ModeController(SwitchingConfig(auto=True, ratio=1.5, window_s=3.0))
    assert feed(ctl, "sync", 0.0, 1.0, [0.4, 0.1, 0.1]) is None
    assert feed(ctl, "sync", 1.0, 12.0, [0.1, 0.1, 0.1]) is None


def test_workers_without_steps_are_left_out_and_one_worker_decides_nothing():
    ctl = ModeController(SwitchingConfig(auto=True, ratio=1.5, window_s=1.0))
    for t in range(10):
        assert ctl.observe(float(t), "sync", [0.5, 0.0], [1, 0]) is None
    assert ctl.ratio() is None


def test_workers_whose_steps_computed_nothing_decide_nothing_and_do_not_crash():
    """Steps without a batch of their own (sync's all-reduce of a worker out of data) carry no
    compute time: a median of 0 gives no ratio (it raised ZeroDivisionError)."""
    ctl = ModeController(SwitchingConfig(auto=True, ratio=1.5, window_s=1.0))
    for t in range(5):
        assert ctl.observe(float(t), "sync", [0.5, 0.0, 0.0], [1, 1, 1]) is None
    assert ctl.ratio() is None
