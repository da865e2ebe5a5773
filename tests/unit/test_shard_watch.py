"""The shard watch (recsync/distributed/shard_watch.py) without Ray: who restarted, from when
a shard counts as down, what an injected kill marks, and when a recovery's downtime ends.

Run: python -m pytest -q tests/unit/test_shard_watch.py"""

from __future__ import annotations

from recsync.distributed.shard_watch import ShardWatch, restarted
from recsync.distributed.status import ShardStatus


def answer(pid=1, version=34, first_pull_unix=None, **more):
    return {"pid": pid, "version": version, "ready_unix": 10.0, "restored": None,
            "first_pull_unix": first_pull_unix, **more}


def test_a_shard_restarted_when_it_answers_from_another_process_than_the_one_seen():
    assert not restarted(None, answer())  # its first answer
    assert not restarted(answer(pid=1), answer(pid=1, version=90))
    assert restarted(answer(pid=1), answer(pid=2))


def test_a_restart_reads_as_restarted_until_acknowledged_with_what_came_before():
    watch = ShardWatch()
    first = watch.seen(0, answer(node_id="n1", node_ip="10.0.0.1"), now=5.0)
    assert not first.restarted and first.version_before is None
    back = watch.seen(0, answer(pid=2, version=30, node_id="n2", node_ip="10.0.0.2"), now=6.0)
    assert back.restarted and back.version_before == 34
    assert back.node == {"node_id": "n2", "node_ip": "10.0.0.2"}
    assert back.node_before == {"node_id": "n1", "node_ip": "10.0.0.1"}
    assert watch.moved(0, 2) and not watch.moved(0, 1) and not watch.moved(1, 2)
    assert watch.seen(0, answer(pid=2, version=31), now=7.0).restarted  # still
    watch.acknowledge(back)
    assert not watch.moved(0, 2)
    assert not watch.seen(0, answer(pid=2, version=31), now=8.0).restarted


def test_a_shard_that_failed_unseen_is_down_from_its_last_answer_an_injected_kill_from_the_kill():
    watch = ShardWatch()
    watch.seen(0, answer(), now=100.0)
    watch.seen(1, answer(), now=100.5)
    watch.seen(1, answer(pid=42), now=999.0)
    watch.killed("ps", 0, 99.0)
    watch.seen(0, answer(pid=7), now=999.0)
    assert watch.killed_at == {0: 99.0, 1: 100.5}
    assert watch.is_down("ps", 0) and watch.recovered(0, 0.0) == 99.0
    assert not watch.is_down("ps", 0) and watch.recovered(0, 123.0) == 123.0


def test_a_killed_worker_is_down_until_its_rank_starts_again_and_a_standby_never_is():
    watch = ShardWatch()
    watch.killed("worker", 2, 5.0)
    watch.killed("standby", 0, 5.0)
    assert watch.is_down("worker", 2) and not watch.is_down("standby", 0)
    assert watch.killed_at == {}
    watch.workers_started([1, 2])
    assert not watch.is_down("worker", 2)


def test_downtime_runs_to_ready_until_the_first_pull_served_after_the_failure():
    watch, rec = ShardWatch(), {}
    watch.downtime_starts(1, rec, killed_unix=97.5, ready_unix=100.0, first_pull_unix=None,
                          start_unix=90.0)
    assert rec == {"killed_s": 7.5, "downtime_s": 2.5, "downtime_to": "ready"}
    watch.downtime_ends(1, 97.0)  # a pull from before the failure: not the one
    assert rec["downtime_to"] == "ready"
    watch.seen(1, answer(first_pull_unix=100.25), now=101.0)  # an answer reports it
    assert rec["downtime_s"] == 2.75 and rec["downtime_to"] == "first pull served"
    assert watch.downtime_open == {}


def test_after_a_rollback_only_a_pull_after_it_ends_the_downtime():
    watch, rec = ShardWatch(), {}
    watch.downtime_starts(0, rec, killed_unix=50.0, ready_unix=60.0, first_pull_unix=55.0,
                          start_unix=0.0, after_unix=58.0)
    assert rec["downtime_to"] == "ready" and rec["downtime_s"] == 10.0
    watch.downtime_ends(0, 61.0)
    assert rec["downtime_s"] == 11.0 and watch.downtime_open == {}


def test_acknowledge_keeps_the_new_process_and_its_node():
    watch = ShardWatch()
    watch.acknowledge(ShardStatus(3, "alive", pid=9, version=5, ready_unix=1.0,
                                  node={"node_id": "n", "node_ip": "ip"}))
    assert watch.shard_seen[3] == {"pid": 9, "version": 5, "ready_unix": 1.0, "restored": None,
                                   "node_id": "n", "node_ip": "ip"}
