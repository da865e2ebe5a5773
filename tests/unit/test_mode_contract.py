"""The mode contract (recsync/modes/base.py) is abstract: a mode, worker half or shard rule that
leaves a required part undefined fails when its module is imported, naming what is missing,
instead of inside a shard or worker actor. Without Ray:

    python -m pytest tests/unit/test_mode_contract.py -q
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from recsync.modes.base import REBUILD_GROUP, Mode, ShardRule, WorkerMode


class Worker(WorkerMode):
    def step(self, batch, ahead=None, thread: int = 0):
        return None


def test_a_mode_without_its_shard_rule_fails_when_its_class_is_made():
    with pytest.raises(TypeError, match=r"NoRule does not define make_rule\(\) \(its shard rule\)"):
        class NoRule(Mode):
            name = "no_rule"
            worker = Worker


def test_a_mode_without_a_name_or_a_worker_half_fails_naming_both():
    with pytest.raises(TypeError) as e:
        class Bare(Mode):
            @classmethod
            def make_rule(cls, cfg, shard, dense_init):
                return None
    assert "name (its key in MODES)" in str(e.value)
    assert "worker (its WorkerMode subclass)" in str(e.value)


def test_a_worker_half_without_step_and_a_rule_without_push_fail_when_made():
    with pytest.raises(TypeError, match=r"does not define step\(\)"):
        class NoStep(WorkerMode):
            pass
    with pytest.raises(TypeError, match=r"does not define push\(\)"):
        class NoPush(ShardRule):
            def end(self, core):
                return 0


def test_a_mode_that_rebuilds_its_group_needs_its_workers_per_step_states():
    with pytest.raises(TypeError, match=r"Worker.recovery_states\(\)"):
        class Rebuilds(Mode):
            name = "rebuilds"
            worker = Worker
            worker_death = REBUILD_GROUP

            @classmethod
            def make_rule(cls, cfg, shard, dense_init):
                return None


def test_a_class_kept_abstract_on_purpose_is_allowed_and_its_subclasses_are_checked():
    class Half(ShardRule, abstract=True):
        def end(self, core):
            return 0

    with pytest.raises(TypeError, match=r"push\(\)"):
        class StillNoPush(Half):
            pass


def test_a_complete_mode_pickled_by_value_loads_and_works_in_another_process():
    """Ray may send a class by value (cloudpickle): the receiving process makes an empty class,
    then sets its attributes, and the check must not take that empty class for an incomplete
    mode."""
    cloudpickle = pytest.importorskip("cloudpickle")

    class Steps(WorkerMode):
        def step(self, batch, ahead=None, thread: int = 0):
            return "stepped"

    class Apply(ShardRule):
        def push(self, core, ids, grads, dense_grad, meta):
            return "applied"

    class Complete(Mode):
        name = "complete"
        worker = Steps

        @classmethod
        def make_rule(cls, cfg, shard, dense_init):
            return Apply()

    # local classes: sent by value, and rebuilt only in a process that has not seen them
    code = ("import sys, cloudpickle; m = cloudpickle.loads(sys.stdin.buffer.read()); "
            "print(m.name, m.make_rule(None, 0, None).push(None, [], [], None, {}), "
            "m.worker(ctx=None).step(None))")
    out = subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(Complete),
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().split() == ["complete", "applied", "stepped"]
