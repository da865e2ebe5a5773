"""The recovery policy (recsync/distributed/policy.py) without Ray: for each kind of worker death
(and lockstep or not, with a group or not), and for every mode in MODES, what a dead worker, a
shard that died with recovery none / partial / full, and a resumed driver lead to."""

from __future__ import annotations

import pytest

from recsync.config import load_config
from recsync.distributed.policy import MAX_WORKER_RESTARTS, Decision, Kind, decide
from recsync.distributed.status import ShardStatus, WorkerStatus
from recsync.modes import MODES
from recsync.modes.base import FROM_REPLICA, REBUILD_GROUP, REPLACE, Mode


def fake_mode(death, lockstep=False, group=False):
    return type(f"Fake_{death}_{lockstep}_{group}", (Mode,), {
        "name": "fake", "worker_death": death, "lockstep": lockstep,
        "needs_group": classmethod(lambda cls, cfg: group)})


FAKES = [fake_mode(d, lockstep, group) for d in (REPLACE, REBUILD_GROUP, FROM_REPLICA)
         for lockstep in (False, True) for group in (False, True)]


def cfg(kind="none", workers=3, shards=2):
    return load_config(None, ['mode="async"', f"cluster.workers={workers}",
                              f"cluster.ps_shards={shards}", f'recovery.kind="{kind}"',
                              "recovery.checkpoint_every_s=1.0", "recovery.mtbf_s=100"])


def workers(states=("running",) * 3, error=None):
    return [WorkerStatus(rank=r, state=s, error=error if s == "error" else None)
            for r, s in enumerate(states)]


def alive(n=2):
    return [ShardStatus(index=i, state="alive", pid=100 + i, version=5) for i in range(n)]


def restarted(shard, n=2):
    return [ShardStatus(index=i, state="alive", pid=200 + i, version=3, restarted=i == shard,
                        restored={"sequence": 1, "version": 3}, version_before=5)
            for i in range(n)]


def dead(shard, n=2, cause="died"):
    return [ShardStatus(index=i, state="dead" if i == shard else "alive", cause=cause)
            for i in range(n)]


# -- each kind of worker death, by the facts ---------------------------------------------------

@pytest.mark.parametrize("mode", FAKES, ids=lambda m: m.__name__)
def test_nothing_wrong_is_continue(mode):
    assert decide(mode, cfg(), workers(), alive()).kind is Kind.CONTINUE
    paused_done = workers(("paused", "done", "running"))
    assert decide(mode, cfg("partial"), paused_done, alive()).kind is Kind.CONTINUE


@pytest.mark.parametrize("group", [False, True])
def test_replace_restarts_the_dead_rank_or_every_rank_on_a_new_group(group):
    d = decide(fake_mode(REPLACE, group=group), cfg(), workers(("running", "dead", "done")),
               alive())
    assert d == Decision(Kind.REPLACE_WORKERS, ranks=(0, 1, 2) if group else (1,), dead=(1,))


def test_rebuild_group_restarts_every_rank_from_a_live_replica():
    d = decide(fake_mode(REBUILD_GROUP, lockstep=True, group=True), cfg(),
               workers(("dead", "running", "running")), alive())
    assert d == Decision(Kind.REBUILD_GROUP, ranks=(0, 1, 2), dead=(0,), source=1)


@pytest.mark.parametrize("group", [False, True])
def test_from_replica_restarts_the_dead_or_every_rank_from_a_live_one(group):
    d = decide(fake_mode(FROM_REPLICA, group=group), cfg(),
               workers(("running", "dead", "dead")), alive())
    assert d == Decision(Kind.RESTART_FROM_REPLICA, ranks=(0, 1, 2) if group else (1, 2),
                         dead=(1, 2), source=0)


@pytest.mark.parametrize("death", [REBUILD_GROUP, FROM_REPLICA])
def test_no_live_replica_left_aborts(death):
    d = decide(fake_mode(death), cfg(), workers(("dead",) * 3), alive())
    assert d.kind is Kind.ABORT
    assert d.reason == "every worker died at once; the dense replicas are lost"


def test_every_replace_worker_dead_is_replaced():
    d = decide(fake_mode(REPLACE), cfg(), workers(("dead",) * 3), alive())
    assert d == Decision(Kind.REPLACE_WORKERS, ranks=(0, 1, 2), dead=(0, 1, 2))


def test_a_worker_that_died_and_one_that_failed_the_dead_one_is_recovered():
    d = decide(fake_mode(REPLACE), cfg(), workers(("error", "dead", "running"), "boom"), alive())
    assert d.kind is Kind.REPLACE_WORKERS and d.ranks == (1,)


@pytest.mark.parametrize("death", [REPLACE, REBUILD_GROUP, FROM_REPLICA])
def test_a_worker_error_alone_aborts_with_it(death):
    d = decide(fake_mode(death), cfg(), workers(("running", "error", "running"), "ValueError: x"),
               alive())
    assert d == Decision(Kind.ABORT, reason="worker 1 failed: ValueError: x")


def test_a_crash_loop_ends_in_an_error():
    mode, ws = fake_mode(REPLACE), workers(("dead", "running", "dead"))
    assert decide(mode, cfg(), ws, alive(), restarts=MAX_WORKER_RESTARTS - 2).kind is \
        Kind.REPLACE_WORKERS
    d = decide(mode, cfg(), ws, alive(), restarts=MAX_WORKER_RESTARTS - 1)
    assert d.kind is Kind.ABORT
    assert d.reason == (f"workers died {MAX_WORKER_RESTARTS + 1} times; giving up (the last: "
                        f"[0, 2]). Check the worker logs for the cause.")


# -- shards ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", FAKES, ids=lambda m: m.__name__)
def test_a_dead_shard_without_recovery_stops_the_run(mode):
    d = decide(mode, cfg("none"), workers(("error", "running", "error"), "pull failed"), dead(1))
    assert d.kind is Kind.ABORT
    assert d.reason == ("parameter-server shard 1 died; the run stops here (recovery.kind = "
                        "\"none\"; with recovery.kind = \"partial\" or \"full\" and "
                        "recovery.checkpoint_every_s > 0 the run goes on from checkpoints)")
    d = decide(mode, cfg("none"), workers(("dead", "running", "running")),
               dead(0, cause="failed to start: ValueError: x"))
    assert d.reason.startswith("parameter-server shard 0 failed to start: ValueError: x; the "
                               "run stops here")


@pytest.mark.parametrize("kind", ["partial", "full"])
def test_a_shard_that_did_not_come_back_stops_the_run(kind):
    d = decide(fake_mode(REPLACE), cfg(kind), workers(("error",) * 3, "x"),
               dead(0, cause="does not answer (5 s)"))
    assert d == Decision(Kind.ABORT, reason="parameter-server shard 0 does not answer (5 s) and "
                                            "did not come back from its checkpoint in time")


def test_a_restarting_shard_with_the_workers_fine_is_waited_for():
    shards = [ShardStatus(0, "restarting"), *alive(2)[1:]]
    assert decide(fake_mode(REPLACE), cfg("partial"), workers(), shards) == Decision(
        Kind.CONTINUE)


@pytest.mark.parametrize("mode", FAKES, ids=lambda m: m.__name__)
def test_partial_recovery_reloads_the_shard_alone_unless_lockstep(mode):
    d = decide(mode, cfg("partial"), workers(), restarted(1))
    if mode.lockstep:  # one shard set back alone would stall the others
        assert d == Decision(Kind.ROLL_BACK, shards=(1,), reason="shard restarted")
    else:
        assert d == Decision(Kind.RELOAD_SHARD, shards=(1,))
    assert decide(mode, cfg("auto"), workers(), restarted(1), recovery="partial") == d


@pytest.mark.parametrize("mode", FAKES, ids=lambda m: m.__name__)
def test_full_recovery_rolls_everything_back(mode):
    d = decide(mode, cfg("full"), workers(("running", "error", "running"), "x"), restarted(0))
    assert d == Decision(Kind.ROLL_BACK, shards=(0,), reason="shard restarted")
    assert d.shard == 0
    assert decide(mode, cfg("auto"), workers(), restarted(0), recovery="full") == d


def test_a_shard_restart_comes_before_a_dead_worker():
    d = decide(fake_mode(REPLACE), cfg("partial"), workers(("dead", "running", "running")),
               restarted(0))
    assert d.kind is Kind.RELOAD_SHARD  # (the dead worker is seen again at the next look)
    seen = [ShardStatus(s.index, "alive", pid=s.pid) for s in restarted(0)]
    assert decide(fake_mode(REPLACE), cfg("partial"), workers(("dead", "running", "running")),
                  seen).kind is Kind.REPLACE_WORKERS


@pytest.mark.parametrize("mode", FAKES, ids=lambda m: m.__name__)
def test_a_resumed_driver_rolls_back_to_the_job_checkpoint(mode):
    assert decide(mode, cfg("full"), [], alive(), resuming=True) == Decision(
        Kind.ROLL_BACK, reason="resume")


def test_an_unknown_worker_death_is_an_error():
    with pytest.raises(ValueError, match="worker_death"):
        decide(fake_mode("reincarnate"), cfg(), workers(("dead", "running", "running")), alive())


# -- every mode --------------------------------------------------------------------------------

EXPECTED = {REPLACE: Kind.REPLACE_WORKERS, REBUILD_GROUP: Kind.REBUILD_GROUP,
            FROM_REPLICA: Kind.RESTART_FROM_REPLICA}


@pytest.mark.parametrize("name", sorted(MODES))
@pytest.mark.parametrize("switching", [False, True])
def test_every_mode_worker_dies(name, switching):
    mode = MODES[name]
    c = cfg()
    if switching:
        c = c.model_copy(update={"switching": c.switching.model_copy(update={"auto": True})})
    d = decide(mode, c, workers(("running", "dead", "running")), alive())
    assert d.kind is EXPECTED[mode.worker_death] and d.dead == (1,)
    assert d.ranks == ((0, 1, 2) if mode.needs_group(c) or mode.worker_death == REBUILD_GROUP
                       else (1,))
    if d.kind is not Kind.REPLACE_WORKERS:
        assert d.source == 0


@pytest.mark.parametrize("name", sorted(MODES))
def test_every_mode_shard_dies(name):
    mode = MODES[name]
    none = decide(mode, cfg("none"), workers(("error",) * 3, "x"), dead(1))
    assert none.kind is Kind.ABORT and "the run stops here" in none.reason
    partial = decide(mode, cfg("partial"), workers(), restarted(1))
    assert partial.kind is (Kind.ROLL_BACK if mode.lockstep else Kind.RELOAD_SHARD)
    assert partial.shards == (1,)
    full = decide(mode, cfg("full"), workers(), restarted(1))
    assert full == Decision(Kind.ROLL_BACK, shards=(1,), reason="shard restarted")


@pytest.mark.parametrize("name", sorted(MODES))
def test_every_mode_driver_resumed(name):
    assert decide(MODES[name], cfg("full"), [], alive(), resuming=True).kind is Kind.ROLL_BACK
