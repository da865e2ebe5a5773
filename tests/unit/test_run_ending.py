"""The end of a distributed run covered by recovery (recsync/distributed/ending.py, and the
policy's ``ending``), on a fake run without Ray: a shard killed in the last steps is recovered
before the end's calls, one that dies during them (the final checkpoint round, the gathering of
the trained rows, the final evaluation) is recovered and the end made again, a rollback or a
restarted worker has the workers train again, and without recovery the run fails with one line
naming the shard and the moment."""

from __future__ import annotations

import pytest
import ray

from fake_actors import FakeActors, fake_run
from recsync.config import load_config
from recsync.distributed import actions, ending
from recsync.distributed.errors import RunFailed
from recsync.distributed.policy import Kind, decide
from recsync.distributed.status import ShardStatus, WorkerStatus
from recsync.modes import MODES


def cfg(mode="async", kind="partial"):
    return load_config(None, [f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                              f'recovery.kind="{kind}"', "recovery.checkpoint_every_s=1",
                              "train.batch_size=8"])


def alive(i, pid=None, version=40):
    return ShardStatus(i, "alive", pid=100 + i if pid is None else pid, version=version)


def restarted(i=1):
    return ShardStatus(i, "alive", pid=42, version=30, restarted=True, version_before=34,
                       ready_unix=3.0, restored={"sequence": 2, "version": 30, "skipped": []})


def dead(i=1):
    return ShardStatus(i, "dead")


class EndActors(FakeActors):
    """What ``finish`` and the actions it leads to use of the actors. ``looks``: the shard
    statuses each ``shard_statuses`` call returns, in turn (the last one from then on);
    ``workers``: the workers' states, all running once workers are started."""

    def __init__(self, mode, looks, workers):
        super().__init__(mode)
        self.looks, self.patience = list(looks), []
        self.statuses = [WorkerStatus(r, s) for r, s in enumerate(workers)]

    def poll(self, tallies):
        return self.statuses

    def shard_statuses(self, watch, patience_s=None):
        self.patience.append(patience_s)
        return self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]

    def start(self, ranks, start_unix, dense_state=None, step_index=0):
        super().start(ranks, start_unix, dense_state)
        self.statuses = [WorkerStatus(r, "running") for r in range(len(self.statuses))]


def FakeRun(c, looks, workers=("done", "done")):
    return fake_run(c, EndActors(c.mode, looks, workers))


class End:
    """The end's calls: raises ``error`` at ``moment`` on the first ``fails`` calls."""

    def __init__(self, fails=0, moment=ending.IN_FINAL_EVAL, error=None):
        self.fails, self.moment, self.calls = fails, moment, 0
        self.error = error or ray.exceptions.ActorDiedError()

    def __call__(self, run, moment):
        self.calls += 1
        moment.now = self.moment
        if self.calls <= self.fails:
            raise self.error
        return {"eval": "scored"}


@pytest.fixture(autouse=True)
def no_after_end(monkeypatch):
    monkeypatch.setattr(ending, "after_end", lambda run: {"after": True})


def test_a_shard_killed_in_the_last_steps_is_recovered_before_the_end():
    """The workers are done while shard 1 restarts: it is waited for (with patience) and its
    partial recovery logged before the final checkpoint, gathering and evaluation."""
    run = FakeRun(cfg(), [[alive(0), restarted()], [alive(0), alive(1, 42, 30)]])
    end = End()
    assert ending.finish(run, end) == {"eval": "scored", "after": True}
    assert run.actors.patience[0] == ending.SHARD_RESTART_WAIT_S and end.calls == 1
    assert [r["kind"] for r in run.record.recoveries] == ["partial"]
    assert run.shard_watch.shard_seen[1]["pid"] == 42 and run.rounds.failures == 1


@pytest.mark.parametrize("moment", [ending.IN_FINAL_CHECKPOINT, ending.IN_GATHER,
                                    ending.IN_FINAL_EVAL])
def test_a_shard_that_dies_during_the_end_is_recovered_and_the_end_made_again(moment):
    run = FakeRun(cfg(), [[alive(0), alive(1)], [alive(0), restarted()]])
    end = End(fails=1, moment=moment)
    assert ending.finish(run, end)["eval"] == "scored"
    assert end.calls == 2
    assert [r["kind"] for r in run.record.recoveries] == ["partial"]
    assert run.record.recoveries[0]["lost_updates"] == 4


def test_a_final_round_that_skipped_a_shard_counts_as_its_death():
    run = FakeRun(cfg(), [[alive(0), alive(1)], [alive(0), restarted()]])
    end = End(fails=1, moment=ending.IN_FINAL_CHECKPOINT, error=ending.ShardSkipped("x"))
    assert ending.finish(run, end)["eval"] == "scored" and end.calls == 2


@pytest.mark.parametrize("mode,kind", [("async", "full"), ("sync", "full")])
def test_a_rollback_at_the_end_has_the_workers_train_again(monkeypatch, mode, kind):
    """Full recovery (a lockstep mode has no other): everything rolls back, and ``finish``
    returns None (the watch loop goes on until the workers are done again)."""
    rolled = []
    monkeypatch.setattr(actions, "full_recovery", lambda run, i, t: rolled.append(i))
    run = FakeRun(cfg(mode, kind), [[alive(0), alive(1)], [alive(0), restarted()]])
    end = End(fails=1, moment=ending.IN_GATHER)
    assert ending.finish(run, end) is None
    assert rolled == [1] and end.calls == 1


def test_a_worker_dead_at_the_end_is_restarted_and_the_workers_go_on():
    run = FakeRun(cfg(), [[alive(0), alive(1)]], workers=("done", "dead"))
    assert ending.finish(run, End()) is None
    assert run.actors.calls == [("retire", [1]), ("spawn", [1], None, 0), ("start", [1])]


def test_without_recovery_a_shard_that_dies_during_the_end_fails_the_run_in_one_line():
    run = FakeRun(cfg(kind="none"), [[alive(0), alive(1)], [alive(0), dead(1)]])
    with pytest.raises(RunFailed) as e:
        ending.finish(run, End(fails=1, moment=ending.IN_FINAL_EVAL))
    assert str(e.value) == ("parameter-server shard 1 died during the final evaluation; the run "
                            "stops here (recovery.kind = \"none\"; with recovery.kind = "
                            "\"partial\" or \"full\" and recovery.checkpoint_every_s > 0 the "
                            "run goes on from checkpoints)")
    assert run.actors.patience == [0.0, 0.0]


def test_without_recovery_a_shard_dead_as_training_ended_fails_before_the_end():
    run = FakeRun(cfg(kind="none"), [[alive(0), dead(1)]])
    end = End()
    with pytest.raises(RunFailed, match="shard 1 died as training ended; the run stops"):
        ending.finish(run, end)
    assert end.calls == 0


def test_an_error_with_nothing_down_fails_with_its_moment():
    run = FakeRun(cfg(), [[alive(0), alive(1)]])
    with pytest.raises(RunFailed) as e:
        ending.finish(run, End(fails=1, moment=ending.IN_GATHER,
                               error=ray.exceptions.GetTimeoutError("slow\nmore")))
    assert str(e.value) == "GetTimeoutError while the trained rows were gathered: slow"


def test_the_end_gives_up_after_so_many_recoveries():
    looks = [[alive(0), alive(1)]] + [[alive(0), restarted()]] * 9  # a new death each time
    run = FakeRun(cfg(), looks)
    end = End(fails=99)
    with pytest.raises(RunFailed, match=f"failed {ending.END_TRIES + 1} times; the last: "
                                        "ActorDiedError during the final evaluation"):
        ending.finish(run, end)
    assert end.calls == ending.END_TRIES + 1


@pytest.mark.parametrize("kind", ["none", "partial"])
def test_the_policy_at_the_end_stops_for_a_gone_shard_with_every_worker_done(kind):
    done = [WorkerStatus(0, "done"), WorkerStatus(1, "done")]
    mode = MODES["async"]
    assert decide(mode, cfg(kind=kind), done, [alive(0), dead(1)]).kind is Kind.CONTINUE
    d = decide(mode, cfg(kind=kind), done, [alive(0), dead(1)], ending="as training ended")
    assert d.kind is Kind.ABORT
    assert d.reason.startswith("parameter-server shard 1 died as training ended")
