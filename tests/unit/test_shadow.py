"""ShadowSync without Ray: the update rules against hand computations, writes from another thread
that leave autograd intact, the rounds of EASGD / MA / BMUF on replicas, and the Hogwild trainer's
scheduling (foreground every k, background, agreement on the last round, errors)."""

import threading
import time

import pytest
import torch

import recsync.modes.shadow.synchronizers as shadow_mod
from cores import test_core
from recsync.embedding.row_optim import RowSGD
from recsync.embedding.spec import TableSpec
from recsync.modes.shadow.hogwild import HogwildTrainer
from recsync.modes.shadow.replica import DenseReplica
from recsync.modes.shadow.rules import BMUF, easgd_delta, mean_of
from recsync.modes.shadow.synchronizers import AveragingSync, ElasticSync


# -- rules -------------------------------------------------------------------------------
def test_easgd_moves_replica_and_center_towards_each_other_by_d():
    w, c = torch.tensor([1.0, 2.0, -4.0]), torch.tensor([0.0, 4.0, 0.0])
    d = easgd_delta(w, c, alpha=0.25)
    torch.testing.assert_close(d, torch.tensor([0.25, -0.5, -1.0]))
    torch.testing.assert_close(w - d, torch.tensor([0.75, 2.5, -3.0]))
    torch.testing.assert_close(c + d, torch.tensor([0.25, 3.5, -1.0]))
    torch.testing.assert_close((w - d) + (c + d), w + c)  # the sum is conserved


def test_ma_is_the_mean():
    summed = torch.tensor([1.0, 2.0]) + torch.tensor([3.0, 6.0]) + torch.tensor([2.0, 1.0])
    torch.testing.assert_close(mean_of(summed, 3), torch.tensor([2.0, 3.0]))


def test_bmuf_momentum_recursion_by_hand():
    # eta = 0.5, zeta = 1, w_g starts at 0
    b = BMUF(torch.tensor([0.0]), momentum=0.5, block_lr=1.0)
    # mean 1: delta = 0.5*0 + 1*(1 - 0) = 1, w_g = 1
    torch.testing.assert_close(b.update(torch.tensor([1.0])), torch.tensor([1.0]))
    # mean 1 again: delta = 0.5*1 + (1 - 1) = 0.5, w_g = 1.5 (the momentum carries on)
    torch.testing.assert_close(b.update(torch.tensor([1.0])), torch.tensor([1.5]))
    # mean 2.5, zeta 1: delta = 0.25 + (2.5 - 1.5) = 1.25, w_g = 2.75
    torch.testing.assert_close(b.update(torch.tensor([2.5])), torch.tensor([2.75]))
    torch.testing.assert_close(b.delta, torch.tensor([1.25]))


def test_bmuf_block_lr_and_nesterov():
    b = BMUF(torch.tensor([2.0]), momentum=0.5, block_lr=0.5, nesterov=True)
    # delta = 0.5 * (4 - 2) = 1, w_g = 3, look-ahead 3 + 0.5 * 1 = 3.5
    torch.testing.assert_close(b.update(torch.tensor([4.0])), torch.tensor([3.5]))
    torch.testing.assert_close(b.global_model, torch.tensor([3.0]))
    with pytest.raises(ValueError, match="momentum"):
        BMUF(torch.tensor([0.0]), momentum=1.0)


# -- the replica ---------------------------------------------------------------------------
def _replica(seed=0, lr=0.1):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return DenseReplica(model, torch.optim.SGD, lr)


def test_writes_through_the_replica_do_not_break_a_backward_pass_in_flight():
    r = _replica()
    x = torch.randn(5, 3)
    loss = r.model(x).square().mean()
    r.add_(torch.ones_like(r.vector()))      # the shadow thread moves the replica...
    r.apply([torch.ones_like(p) for p in r.params])  # ...and another thread steps
    grads = torch.autograd.grad(loss, r.params)      # the backward pass still runs
    assert all(g.shape == p.shape for g, p in zip(grads, r.params))
    # the control: the same write on the autograd leaf itself breaks it
    loss = r.model(x).square().mean()
    with torch.no_grad():
        r.params[2].add_(1.0)  # the second layer's weight, saved for the backward pass
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, r.params)


def test_replica_apply_is_one_optimizer_step_and_add_moves_every_parameter():
    r = _replica(lr=0.5)
    before = r.vector()
    r.apply([torch.full_like(p, 2.0) for p in r.params])
    torch.testing.assert_close(r.vector(), before - 1.0)  # SGD: -lr * grad
    r.add_(torch.arange(len(before), dtype=torch.float32))
    torch.testing.assert_close(r.vector(), before - 1.0 + torch.arange(len(before)))


# -- rounds --------------------------------------------------------------------------------
class FakeShard:
    """A PS shard handle holding EASGD's center; ``.remote`` runs at once (ray.get patched)."""

    def __init__(self, core):
        self.call = type("M", (), {"remote": staticmethod(
            lambda verb, *args: getattr(core.rule, verb)(core, *args))})


def test_easgd_round_moves_replica_and_the_shards_center_by_d(monkeypatch):
    monkeypatch.setattr(shadow_mod.ray, "get", lambda x: x)
    r = _replica()
    w = r.vector()
    center = torch.zeros_like(w)
    core = test_core([TableSpec("t", 4, 2)], RowSGD(0.1), shard=0, num_shards=1,
                     num_workers=2, center=center)
    sync = ElasticSync(r, [FakeShard(core)], alpha=0.5)
    assert sync.round(done=False) is False
    torch.testing.assert_close(r.vector(), w * 0.5)
    torch.testing.assert_close(torch.from_numpy(core.rule.model_dense(core)), w * 0.5)
    assert core.stats()["easgd_pushes"] == 1
    assert sync.round(done=True) is True  # EASGD needs no agreement: done is done


def test_easgd_round_with_a_restarting_shard_is_skipped_under_partial_recovery():
    import ray

    class Restarting:
        class call:  # noqa: N801 - shaped like a Ray actor method
            @staticmethod
            def remote(*args):
                raise ray.exceptions.RayActorError()

    r = _replica()
    before = r.vector()
    sync = ElasticSync(r, [Restarting()], alpha=0.5, survive_shard_restarts=True)
    assert sync.round(done=False) is False and sync.skipped == 1
    torch.testing.assert_close(r.vector(), before)  # nothing moved
    with pytest.raises(ray.exceptions.RayActorError):
        ElasticSync(r, [Restarting()], alpha=0.5).round(done=False)


class ThreadGroup:
    """An all-reduce among threads (one per trainer), standing in for a gloo group."""

    def __init__(self, size):
        self.size, self.barrier = size, threading.Barrier(size, timeout=10)
        self.bufs, self.lock = {}, threading.Lock()

    def all_reduce(self, buf, group=None):
        me = threading.get_ident()
        with self.lock:
            self.bufs[me] = buf.clone()
        self.barrier.wait()
        total = sum(self.bufs.values())
        self.barrier.wait()
        with self.lock:  # gone before the next round: its threads may have other idents
            del self.bufs[me]
        buf.copy_(total)


def _in_threads(fns):
    out, threads = [None] * len(fns), []
    for i, fn in enumerate(fns):
        threads.append(threading.Thread(target=lambda i=i, fn=fn: out.__setitem__(i, fn())))
        threads[-1].start()
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive(), "a round was left waiting"
    return out


@pytest.fixture
def thread_group(monkeypatch):
    import torch.distributed as dist
    group = ThreadGroup(2)
    monkeypatch.setattr(dist, "all_reduce", group.all_reduce)
    return group


def test_ma_round_gives_every_replica_the_mean_and_agrees_when_all_are_done(thread_group):
    a, b = _replica(seed=1), _replica(seed=2)
    mean = (a.vector() + b.vector()) / 2
    sa, sb = AveragingSync(a, None, 2), AveragingSync(b, None, 2)
    assert _in_threads([lambda: sa.round(False), lambda: sb.round(True)]) == [False, False]
    torch.testing.assert_close(a.vector(), mean)
    torch.testing.assert_close(b.vector(), mean)
    assert _in_threads([lambda: sa.round(True), lambda: sb.round(True)]) == [True, True]


def test_bmuf_round_moves_every_replica_to_the_global_model(thread_group):
    a, b = _replica(seed=1), _replica(seed=1)
    start = a.vector()
    ba, bb = BMUF(start, 0.5), BMUF(start, 0.5)
    a.add_(torch.full_like(start, 1.0))  # trainer a trained by +1, b by +3
    b.add_(torch.full_like(start, 3.0))
    sa, sb = AveragingSync(a, None, 2, ba), AveragingSync(b, None, 2, bb)
    _in_threads([lambda: sa.round(False), lambda: sb.round(False)])
    torch.testing.assert_close(a.vector(), start + 2.0)  # delta = mean - w_g = 2
    torch.testing.assert_close(b.vector(), start + 2.0)
    _in_threads([lambda: sa.round(False), lambda: sb.round(False)])  # no training between
    torch.testing.assert_close(a.vector(), start + 3.0)  # delta = 0.5 * 2: the momentum
    torch.testing.assert_close(ba.global_model, bb.global_model)


def test_a_formation_pauses_every_trainer_after_one_round_and_a_joiner_takes_bmuf_state(
        monkeypatch):
    """An elastic run's formation (distributed/regroup_rounds.py): the pause rides in a round,
    every trainer stops after it; one leaves, a third joins with the group's BMUF block state,
    and the next round (a mean over three) leaves all three BMUF states equal."""
    import torch.distributed as dist
    monkeypatch.setattr(dist, "all_reduce", lambda buf, group: group.all_reduce(buf))
    reps = [_replica(seed=s) for s in (1, 2)]
    start = reps[0].vector()
    two = ThreadGroup(2)
    syncs = [AveragingSync(r, two, 2, BMUF(start, 0.5)) for r in reps]
    syncs[0].request_pause()
    assert _in_threads([lambda s=s: s.round(False) for s in syncs]) == [False, False]
    assert [s.paused_after for s in syncs] == [1, 1]
    assert [s.ready(wait=False) for s in syncs] == [False, False]  # a foreground round skips
    syncs[1].request_pause()  # asked once paused: nothing carried into a later round
    leaver = threading.Thread(target=lambda: syncs[1].round(True))  # waits while paused
    leaver.start()
    time.sleep(0.05)
    assert leaver.is_alive()
    syncs[1].leave()
    leaver.join(timeout=5)
    assert not leaver.is_alive() and syncs[1].round(False) is True  # no rounds any more

    three = ThreadGroup(3)
    joiners = [_replica(seed=s) for s in (3, 4)]
    bmufs = [BMUF(r.vector(), 0.5) for r in joiners]
    for b in bmufs:
        b.load(syncs[0].bmuf_state())
    new = [AveragingSync(r, three, 3, b) for r, b in zip(joiners, bmufs)]
    syncs[0].regroup(three, 3)
    members = [syncs[0], *new]
    assert _in_threads([lambda s=s: s.round(False) for s in members]) == [False] * 3
    assert [s.paused_after for s in members] == [None] * 3
    for s in new:
        torch.testing.assert_close(s.bmuf.global_model, syncs[0].bmuf.global_model)
        torch.testing.assert_close(s.bmuf.delta, syncs[0].bmuf.delta)
    torch.testing.assert_close(joiners[0].vector(), reps[0].vector())
    assert _in_threads([lambda s=s: s.round(True) for s in members]) == [True] * 3


def test_a_pause_asked_in_the_round_that_finds_everyone_done_does_not_pause(thread_group):
    """That round ends the rounds: a trainer paused there would report a pause that no round
    follows (the driver would form a group whose old members never come)."""
    a, b = _replica(seed=1), _replica(seed=2)
    sa, sb = AveragingSync(a, None, 2), AveragingSync(b, None, 2)
    sa.request_pause()
    assert _in_threads([lambda: sa.round(True), lambda: sb.round(True)]) == [True, True]
    assert sa.paused_after is None and sb.paused_after is None


# -- the Hogwild trainer ---------------------------------------------------------------------
class CountingSync:
    def __init__(self):
        self.calls, self.lock = [], threading.Lock()

    def round(self, done):
        with self.lock:
            self.calls.append(done)
        return done


def _steps(counts, record=None, sleep=0.0):
    def make(n):
        left = [n]

        def step():
            if left[0] == 0:
                return False
            left[0] -= 1
            if record is not None:
                record.append(threading.get_ident())
            time.sleep(sleep)
            return True
        return step
    return [make(n) for n in counts]


def test_foreground_syncs_every_k_iterations_of_the_trainer():
    sync = CountingSync()
    t = HogwildTrainer(_steps([12, 11]), sync, background=False, every=5)
    t.run()
    assert t.iterations == 23
    assert t.stats.rounds == 4 and dict(t.stats.gaps) == {5: 4}  # at 5, 10, 15, 20
    assert sync.calls == [False] * 4 + [True]  # and one final round, saying it is done
    assert t.threads_alive() == 0


def test_background_syncs_while_training_and_stops_after_a_final_round():
    sync = CountingSync()
    t = HogwildTrainer(_steps([20, 20], sleep=0.01), sync, background=True,
                       min_interval_s=0.02)
    t.run()
    assert t.iterations == 40
    assert t.stats.rounds >= 3  # ~0.2 s of training, a round every 0.02 s at most
    assert sync.calls[-1] is True and sync.calls.count(True) == 1
    assert sum(n * k for k, n in t.stats.gaps.items()) <= 40
    assert t.threads_alive() == 0


def test_hogwild_threads_run_at_the_same_time():
    seen = []
    t = HogwildTrainer(_steps([30, 30], record=seen, sleep=0.005), None, background=True)
    t.run()
    assert len(set(seen)) == 2 and t.stats.rounds == 0  # no sync: algorithm none


def test_trainers_with_different_amounts_of_data_agree_on_the_last_round(thread_group):
    """Foreground MA on two trainers: one runs out of data long before the other, keeps
    answering rounds, and both stop after the same round (no collective left waiting)."""
    a, b = _replica(seed=1), _replica(seed=2)
    ta = HogwildTrainer(_steps([7]), AveragingSync(a, None, 2), background=False, every=3)
    tb = HogwildTrainer(_steps([31]), AveragingSync(b, None, 2), background=False, every=3)
    _in_threads([ta.run, tb.run])
    assert tb.stats.rounds == 10 and ta.stats.rounds == 2
    assert ta.stats.rounds + ta.stats.final_rounds == tb.stats.rounds + tb.stats.final_rounds
    torch.testing.assert_close(a.vector(), b.vector())  # the last round averaged them
    assert ta.threads_alive() == tb.threads_alive() == 0


def test_a_failing_training_thread_stops_the_others_and_the_shadow_thread():
    calls = [0]

    def bad():
        calls[0] += 1
        if calls[0] == 3:
            raise ValueError("bad batch")
        time.sleep(0.01)
        return True

    forever = _steps([10**9], sleep=0.01)[0]
    t = HogwildTrainer([bad, forever], CountingSync(), background=True, min_interval_s=0.01)
    with pytest.raises(ValueError, match="bad batch"):
        t.run()
    deadline = time.time() + 5
    while t.threads_alive() and time.time() < deadline:
        time.sleep(0.01)
    assert t.threads_alive() == 0
