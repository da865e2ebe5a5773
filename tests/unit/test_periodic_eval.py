"""distributed/evals.py without Ray: when evaluations start, and that one meeting a shard
going down (or overtaken by a recovery) is skipped with an event while a bug still fails the
run. (A whole run: tests/harness/test_periodic_eval_runs_harness.py.)"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import ray
import torch

from recsync.config import load_config
from recsync.distributed.evals import PeriodicEval
from recsync.run.record import RunRecord


class DeadShard:
    """Its verbs fail as a dead actor's do."""

    def __init__(self, error: BaseException, gate: threading.Event | None = None):
        self.error, self.gate = error, gate
        self.call = SimpleNamespace(remote=self._remote)

    def _remote(self, *args):
        if self.gate is not None:
            self.gate.wait(5)
        raise self.error


def fake_run(error: BaseException, gate: threading.Event | None = None):
    cfg = load_config(None, ["train.eval_every_samples=100"])
    return SimpleNamespace(cfg=cfg, record=RunRecord(),
                           model=SimpleNamespace(dense_model=torch.nn.Linear(2, 1)),
                           actors=SimpleNamespace(shards=[DeadShard(error, gate)], workers=[None]),
                           tallies=SimpleNamespace(start_unix=0.0))


def test_due_every_eval_every_samples_one_at_a_time():
    gate = threading.Event()
    run = fake_run(ray.exceptions.RayActorError(), gate)
    evals = PeriodicEval(run, total_samples=1000)
    assert evals.every == 100 and run.record.eval_every == 100
    evals.start_if_due(99, 1.0)
    assert evals.thread is None
    evals.start_if_due(250, 1.0)  # due; the next one after 250 samples is at 300
    first = evals.thread
    assert first is not None and evals.next == 300
    evals.start_if_due(400, 2.0)  # one at a time: not while the first goes on
    assert evals.thread is first
    gate.set()
    evals.close()


def test_a_dead_shard_skips_the_evaluation_with_an_event():
    run = fake_run(ray.exceptions.RayActorError())
    evals = PeriodicEval(run, total_samples=1000)
    evals.start_if_due(100, 1.0)
    assert evals.collect(wait=True) is None
    assert run.record.evals == [] and run.record.evals_skipped == 1
    (event,) = run.record.events
    assert event["event"].startswith("evaluation at 100 samples skipped: a shard or worker was "
                                     "not answering (RayActorError")
    assert evals.thread is None  # the next one may start
    evals.start_if_due(200, 2.0)
    assert evals.thread is not None
    evals.close()


def test_a_bug_in_an_evaluation_fails_the_run():
    run = fake_run(ZeroDivisionError("a bug"))
    evals = PeriodicEval(run, total_samples=1000)
    evals.start_if_due(100, 1.0)
    with pytest.raises(ZeroDivisionError):
        evals.collect(wait=True)


def test_close_does_not_wait_for_a_stuck_thread_for_ever():
    gate = threading.Event()  # never set before close: the thread is stuck in a call
    run = fake_run(ray.exceptions.RayActorError(), gate)
    evals = PeriodicEval(run, total_samples=1000)
    evals.start_if_due(100, 1.0)
    evals.close()
    assert evals.thread.daemon  # it cannot keep the driver's process alive
    gate.set()
