"""The driver's actions (recsync/distributed/actions.py), its watch loop's decisions and its
switch schedule on a run of real Ray-free parts and fake actors (fake_actors.py): what each
decision does to the run and how it is logged.

Run: python -m pytest -q tests/unit/test_driver_actions.py"""

from __future__ import annotations

import pytest

from fake_actors import FakeActors, fake_run, restart_calls
from recsync.config import load_config
from recsync.distributed import actions
from recsync.distributed.errors import RunFailed
from recsync.distributed.policy import Decision, Kind
from recsync.distributed.shard_watch import ShardWatch
from recsync.distributed.status import ShardStatus, WorkerStatus
from recsync.distributed.switching import Switcher
from recsync.distributed.watch import settle
from recsync.modes.base import REPLACE, Mode

M = type("Replace", (Mode,), {"name": "m", "worker_death": REPLACE})  # a mode of its own


def FakeRun(c, versions=(7, 7), states=(6, 7), shard_watch=None):
    """A run in mode "m" (``M``) whose actors are fake."""
    return fake_run(c, FakeActors("m", M, versions, states), shard_watch)


def calls(run) -> list:
    return run.actors.calls


def cfg(*extra):
    return load_config(None, ['mode="async"', "cluster.workers=3", "cluster.ps_shards=2",
                              *extra])


def test_replace_restarts_the_ranks_and_logs_it():
    run = FakeRun(cfg())
    actions.carry_out(run, Decision(Kind.REPLACE_WORKERS, ranks=(1,), dead=(1,)), [], 3.0)
    assert calls(run) == restart_calls([1]) and run.tallies.restarts == 1
    assert run.record.events[-1]["event"] == "worker(s) [1] died; restarted, their chunks requeued"
    actions.carry_out(run, Decision(Kind.REPLACE_WORKERS, ranks=(0, 1, 2), dead=(2,)), [], 3.0)
    assert calls(run)[3:] == restart_calls([0, 1, 2]) and run.tallies.restarts == 2
    assert run.record.events[-1]["event"] == ("worker(s) [2] died; every worker restarted on a "
                                              "new group, chunks requeued")
    # the ranks, as data (the chaos scenario matches each kill to the restart that followed)
    assert run.record.events[-1]["dead"] == [2]
    assert run.record.events[-1]["restarted"] == [0, 1, 2]


def test_rebuild_group_starts_every_rank_at_the_step_the_ps_completed():
    run = FakeRun(cfg(), versions=(7, 6), states=(6, 7))
    actions.carry_out(run, Decision(Kind.REBUILD_GROUP, ranks=(0, 1, 2), dead=(0,), source=1),
                      [], 1.0)
    assert calls(run) == [("retire", [0, 1, 2]), ("call", "drop_incomplete"),
                          ("advance", 7, [1]), ("spawn", [0, 1, 2], {"params": 7}, 7),
                          ("start", [0, 1, 2])]
    assert run.record.events[-1]["event"] == (
        "worker(s) [0] died; m group rebuilt at step 7 from worker 1's replica, chunks "
        "requeued; shard(s) [1] had not completed step 6 and skip its row update")


def test_rebuild_group_without_the_completed_step_fails():
    run = FakeRun(cfg(), versions=(9, 9), states=(6, 7))
    with pytest.raises(RunFailed, match=r"cannot rebuild the m group: the PS completed step 9, "
                                        r"worker 1's replica knows steps \[6, 7\]"):
        actions.carry_out(run, Decision(Kind.REBUILD_GROUP, ranks=(0, 1), dead=(0,), source=1),
                          [], 1.0)


def test_restart_from_replica_resets_the_optimizer_state():
    run = FakeRun(cfg())
    actions.carry_out(run, Decision(Kind.RESTART_FROM_REPLICA, ranks=(2,), dead=(2,), source=0),
                      [], 1.0)
    assert calls(run) == restart_calls([2], {"params": "replica 0", "optimizer": None})
    assert "restarted from worker 0's dense replica (dense optimizer state reset)" in \
        run.record.events[-1]["event"]


def test_abort_raises_with_the_message():
    with pytest.raises(RunFailed, match="^boom$"):
        actions.carry_out(FakeRun(cfg()), Decision(Kind.ABORT, reason="boom"), [], 0.0)


def restarted_shard(index=1, sequence=2):
    return ShardStatus(index, "alive", pid=42, version=30, ready_unix=100.0,
                       restored={"sequence": sequence, "version": 30, "skipped": [],
                                 "load_s": 0.1},
                       restarted=True, version_before=34)


def test_partial_recovery_counts_the_lost_updates_and_acknowledges_the_restart():
    c = cfg("train.batch_size=8", 'recovery.kind="partial"', "recovery.checkpoint_every_s=1")
    run = FakeRun(c)
    run.shard_watch.killed("ps", 1, 97.5)
    shards = [ShardStatus(0, "alive", pid=1, version=40), restarted_shard()]
    actions.carry_out(run, Decision(Kind.RELOAD_SHARD, shards=(1,)), shards, 12.0)
    [rec] = run.record.recoveries
    assert rec["kind"] == "partial" and rec["shard"] == 1 and rec["lost_updates"] == 4
    assert rec["lost_samples"] == 4 * 8 and rec["sequence"] == 2
    assert rec["ready_s"] == 100.0 - run.tallies.start_unix  # when the new process was ready
    # no pull served yet: down until ready for now; the first pull served ends it
    assert rec["downtime_s"] == 2.5 and rec["downtime_to"] == "ready"
    watch = run.shard_watch
    watch.downtime_ends(1, None)
    watch.downtime_ends(1, 97.0)  # (a pull from before the failure: not the one)
    assert rec["downtime_to"] == "ready"
    watch.downtime_ends(1, 100.25)
    assert rec["downtime_s"] == 2.75 and rec["downtime_to"] == "first pull served"
    assert watch.downtime_open == {}
    assert run.rounds.failures == 1  # the checkpoint interval is chosen again
    assert watch.shard_seen[1]["pid"] == 42 and watch.killed_at == {}
    assert run.record.events[-1]["event"] == ("partial recovery: shard 1 restarted from "
                                              "checkpoint 2 (version 30); its 4 updates since "
                                              "(~32 samples) are lost")


def test_settle_logs_a_partial_recovery_then_replaces_the_dead_worker():
    run = FakeRun(cfg('recovery.kind="partial"', "recovery.checkpoint_every_s=1"))
    workers = [WorkerStatus(0, "running"), WorkerStatus(1, "dead"), WorkerStatus(2, "running")]
    shards = [ShardStatus(0, "alive", pid=1, version=40), restarted_shard()]
    d = settle(run, workers, shards, 5.0)
    assert d.kind is Kind.REPLACE_WORKERS
    assert run.rounds.failures == 1 and calls(run) == restart_calls([1])
    assert [r["kind"] for r in run.record.recoveries] == ["partial"]


def test_the_switch_schedule_and_no_controller():
    c = load_config(None, ['mode="sync"', "cluster.workers=2",
                           'switching.schedule=[{to="gba", at_step=20}, {to="gba", at_s=5.0}, '
                           '{to="sync", at_s=9.0}]'])
    sw = Switcher(c)
    assert sw.due("sync", [], 1.0, 19) is None
    assert sw.due("sync", [], 1.0, 20) == ("gba", "schedule: switching.schedule says gba "
                                                  "at_step = 20")
    assert sw.due("gba", [], 6.0, 30) is None  # already in gba: that entry passes
    assert sw.due("gba", [], 9.0, 40) == ("sync", "schedule: switching.schedule says sync "
                                                  "at_s = 9")
    assert sw.controller is None  # (no controller without switching.auto)


def test_a_shard_restarted_without_an_injected_kill_is_down_from_its_last_answer():
    """A shard killed from outside (kill -9, a lost machine): its downtime counts from the
    driver's last answer from the old process (it read 0.0 before), an injected kill's from
    the kill."""
    watch = ShardWatch()
    inc = {"pid": 1, "version": 34, "ready_unix": 10.0, "restored": None,
           "first_pull_unix": None}
    watch.seen(0, inc, now=100.0)
    watch.seen(1, inc, now=100.5)  # shard 1's last answer
    back = watch.seen(1, {**inc, "pid": 42, "version": 30, "ready_unix": 103.0,
                          "restored": restarted_shard().restored}, now=999.0)
    assert back.restarted and watch.killed_at == {1: 100.5}
    watch.killed("ps", 0, 99.0)  # an injected kill keeps its own time
    watch.seen(0, {**inc, "pid": 7}, now=999.0)
    assert watch.killed_at == {0: 99.0, 1: 100.5}

    fake = FakeRun(cfg("train.batch_size=8", 'recovery.kind="partial"',
                       "recovery.checkpoint_every_s=1"), shard_watch=watch)
    actions.carry_out(fake, Decision(Kind.RELOAD_SHARD, shards=(1,)),
                      [ShardStatus(0, "alive", pid=1, version=40), back], 12.0)
    assert fake.record.recoveries[0]["downtime_s"] == 2.5


@pytest.mark.parametrize("kind, interval", [("partial", 2 * 75.0 * 2 * 0.01),  # 2 F S target
                                            ("full", (2 * 0.02 * 75.0) ** 0.5)])  # Young's
def test_the_interval_is_chosen_again_after_a_failure_from_the_failures_seen(kind, interval):
    """mtbf_s = 100 s counts as one failure interval seen before the run: after a failure at
    50 s, F = (100 + 50) / 2 = 75 s."""
    run = FakeRun(cfg(f'recovery.kind="{kind}"', "recovery.mtbf_s=100"))
    rounds = run.rounds
    assert rounds.recovery == kind
    rounds.failed(10.0)  # before the interval was chosen: counted, nothing chosen
    assert run.record.interval_decision is None and rounds.failures == 1
    rounds.failures = 0
    rounds.costs = (0.02, 0.0)
    run.record.interval_decision = {"rechosen": []}
    rounds.failed(50.0)
    assert rounds.every == pytest.approx(interval)
    (entry,) = run.record.interval_decision["rechosen"]
    assert entry["mtbf_s"] == 75.0 and entry["failures"] == 1
    assert run.record.events[-1]["event"].startswith(
        "1 failure(s) in 50.0 s and recovery.mtbf_s 100 s: MTBF taken as 75.0 s; ")


def test_a_round_chooses_the_interval_again_from_recent_costs_and_the_time_without_failure():
    """Partial, mtbf_s = 100 s, 2 shards, PLS target 0.01: T = 2 F S 0.01. At 60 s with no
    failure F = (100 + 60) / 1 = 160 s, T = 6.4 s; the save cost is the median of the last
    five rounds that trained (the round before training blocked nothing and is left out). A
    round where T moves by 10% or less records nothing."""
    run = FakeRun(cfg('recovery.kind="partial"', "recovery.mtbf_s=100"))
    rounds = run.rounds
    rounds.every, rounds.costs = 4.0, (0.001, 0.0)
    run.record.interval_decision = {"rechosen": []}
    run.record.checkpoints = [{"samples": 0, "blocked_s": 0.0}] + [
        {"samples": 100 * i, "blocked_s": b} for i, b in enumerate([9, 1, 2, 3, 4, 5], 1)]
    rounds.rechoose(60.0, after_failure=False)
    assert rounds.every == pytest.approx(6.4) and rounds.costs[0] == 3
    (entry,) = run.record.interval_decision["rechosen"]
    assert entry["mtbf_s"] == 160.0 and entry["save_cost_s"] == 3
    assert not entry["after_failure"]
    rounds.rechoose(63.0, after_failure=False)  # T = 6.52 s: within 10% of 6.4
    assert rounds.every == pytest.approx(6.4) and len(run.record.interval_decision["rechosen"]) == 1
