"""Elastic runs (cluster.workers = [min, max]) on the runtime harness: the worker count follows
`recsync scale` while the run goes on, workers that leave finish their chunks (every chunk once,
every sample counted once), a dead worker is not waited for, and what happened is in
summary.json and metrics.jsonl. (On a Ray cluster whose nodes come and go:
tests/integration/test_elastic.py.)"""

import json
import threading
import time

import pytest

import recsync
from recsync.data.reader import Dataset
from recsync.run.driver import run
from harness_config import B, config


def _lines(out):
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _when(out, test, timeout_s=60.0):
    """Wait until ``test(lines of metrics.jsonl)`` holds."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if test(_lines(out)):
            return
        time.sleep(0.05)
    raise AssertionError(f"not seen in {timeout_s} s: {_lines(out)[-1:]}")


def _scaled(out, start: int, steps: list[int]):
    """In a thread: once ``start`` workers train, ask for each of ``steps`` workers in turn,
    each once the run has as many as asked before and has trained some more samples."""
    errors = []

    def go():
        try:
            _when(out, lambda ls: ls and ls[-1]["workers"] == start and ls[-1]["samples"] > 0)
            for n in steps:
                seen = _lines(out)[-1]["samples"]
                recsync.scale(out, workers=n)
                _when(out, lambda ls: ls[-1]["workers"] == n and ls[-1]["samples"] > seen)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, errors


def _run_scaled(cfg, tmp_path, start: int, steps: list[int]):
    """(summary, output folder) of a run of ``cfg`` scaled as ``_scaled`` says; it completed
    and every request was seen through."""
    out = tmp_path / "run"
    out.mkdir()
    thread, errors = _scaled(out, start, steps)
    summary = run(cfg, out)
    thread.join(timeout=5)
    assert not errors, errors
    assert summary["status"] == "completed", summary["error"]
    return summary, out


@pytest.mark.parametrize("mode,algorithm", [
    ("async", "easgd"), ("gba", "easgd"), ("eager", "easgd"), ("sync", "easgd"),
    ("hybrid", "easgd"), ("shadow", "easgd"), ("foreground", "easgd"), ("shadow", "ma"),
    ("foreground", "bmuf")])
def test_scaled_2_4_2_completes_every_chunk_once_and_counts_every_sample(fake_ray, data,
                                                                         tmp_path, mode,
                                                                         algorithm):
    """Every elastic mode (``algorithm``: shadow's and foreground's); sync and hybrid form their
    group again at each change (their oracle at a fixed size: test_runtime_harness.py), and so
    do shadow and foreground with MA or BMUF (their averaging rounds' group)."""
    # the three changes take about 1.5 s each (a poll, the request, a drain's second); a run
    # whose group re-forms must last past the last one and its next round: 8 epochs took 5.8
    # s on a fast machine, the last drain ending with training (2026-11-28, CI runs 66, 71)
    regroups = mode in ("shadow", "foreground") and algorithm != "easgd"
    epochs = 12 if regroups else 8
    cfg = config(data, f'mode="{mode}"', f'shadow.algorithm="{algorithm}"',
                 "cluster.workers=[2, 4]",
                 "cluster.ps_shards=2",
                 f"data.chunk_rows={2 * B}", f"train.epochs={epochs}", "network.latency_ms=2")
    # starts at the max (every worker can be placed here), then 2 -> 4 -> 2
    summary, out = _run_scaled(cfg, tmp_path, 4, [2, 4, 2])
    ds = Dataset(data)
    queue = summary["queue"]
    chunks = len(ds.chunks("train", 2 * B))
    assert queue["completed"] == epochs * chunks and queue["completed_more_than_once"] == 0
    assert queue["released"] == 0  # every drain finished its chunks: nothing trained twice
    assert summary["samples"] == epochs * ds.rows("train")
    e = summary["elastic"]
    counts = iter(p["workers"] for p in e["timeline"])
    assert all(n in counts for n in (4, 2, 4, 2))  # in this order (the first may be fewer:
    # workers built after the minimum)
    assert [r.get("workers") for r in e["requests"]] == [2, 4, 2]
    assert len(e["drains"]) == 4 and e["drains_stopped"] == 0  # 4 -> 2, twice
    assert all(d["drain_s"] < cfg.cluster.drain_grace_s for d in e["drains"])
    assert len(e["joins"]) == 6  # 4 at the start, 2 when scaled up again
    assert all(j["first_step_s"] is not None for j in e["joins"])
    assert {line["workers"] for line in _lines(out)} >= {2, 4}
    if regroups:
        formed = [(len(f["members"]), len(f["joined"]), len(f["left"])) for f in e["formations"]]
        # the first may be of the two built first, the other two joining at the next
        assert formed[-3:] == [(2, 0, 2), (4, 2, 0), (2, 0, 2)], formed
        assert formed[-4][0] == 4 and formed[0][1] == formed[0][0], formed
        assert not any(f["rebuilt"] for f in e["formations"])
        assert all(w["steps"] * B == w["samples"] for w in summary["per_worker"])  # each
        # trainer's own batch size (not a share of a global batch)


@pytest.mark.parametrize("mode", ["async", "sync", "hybrid", "shadow"])
def test_a_dead_worker_is_not_waited_for_and_a_new_one_joins(fake_ray, data, tmp_path, mode):
    """A group (sync, hybrid; shadow's MA rounds) is rebuilt without the dead worker, then
    formed again with the new one."""
    cfg = config(data, f'mode="{mode}"', "cluster.workers=[1, 2]", "cluster.ps_shards=2",
                 f"data.chunk_rows={2 * B}", "train.epochs=12", 'network.latency_ms=2',
                 'faults.kills=[{target="worker", index=1, at_s=1.0}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    e = summary["elastic"]
    assert [d["rank"] for d in e["deaths"]] == [1]
    assert [j["rank"] for j in e["joins"]].count(1) == 2  # asked for again, and joined
    queue = summary["queue"]
    assert queue["completed_more_than_once"] == 0 and queue["completed_never"] == 0
    assert summary["samples"] >= 12 * Dataset(data).rows("train")
    if mode != "async":
        sizes = [(len(f["members"]), f["rebuilt"]) for f in e["formations"]]
        assert (1, True) in sizes and sizes[-1] == (2, False), sizes


@pytest.mark.parametrize("mode", ["shadow", "foreground"])
def test_an_averaging_trainer_that_overruns_its_grace_leaves_the_group_and_gives_its_chunk_back(
        fake_ray, data, tmp_path, mode):
    """MA's rounds: a leaver still training after ``drain_grace_s`` is taken out of the group
    (the others' rounds pause, then go on without it) and stopped; its chunk is trained again
    by the others (``queue.released``), every chunk completed once."""
    cfg = config(data, f'mode="{mode}"', 'shadow.algorithm="ma"', "cluster.workers=[1, 2]",
                 "cluster.ps_shards=1", "data.chunk_rows=2048", "train.epochs=4",
                 "network.latency_ms=2", "cluster.drain_grace_s=0.05",
                 "shadow.foreground_every=1",  # the pause comes at its next iteration
                 "faults.stragglers=[{worker=1, factor=200}]")  # its chunk takes ~30 s
    summary, _ = _run_scaled(cfg, tmp_path, 2, [1])
    e, q = summary["elastic"], summary["queue"]
    assert [(d["rank"], d["stopped"]) for d in e["drains"]] == [(1, True)]
    # it left in one formation (a later one may start a new trainer from the replica kept,
    # when the other's rounds ended before the chunk given back was trained)
    assert [f["left"] for f in e["formations"] if f["left"]] == [[1]]
    assert q["released"] == 1 and q["completed_more_than_once"] == 0
    assert q["completed_never"] == 0 and q["completed"] == q["chunks"]
    assert summary["samples"] >= 4 * Dataset(data).rows("train")


@pytest.mark.parametrize("mode", ["shadow", "foreground"])
def test_a_shadow_trainer_joins_from_a_live_replica(fake_ray, data, tmp_path, mode):
    cfg = config(data, f'mode="{mode}"', 'shadow.algorithm="easgd"', "cluster.workers=[1, 2]",
                 "cluster.ps_shards=2", f"data.chunk_rows={2 * B}", "train.epochs=12",
                 'network.latency_ms=2')
    summary, _ = _run_scaled(cfg, tmp_path, 2, [1, 2])
    late = summary["elastic"]["joins"][2:]  # after the first two
    assert [j["rank"] for j in late] == [1] and late[0]["from_replica"] == 0
    assert summary["queue"]["completed_more_than_once"] == 0
    assert 0.5 < summary["eval"]["auc"] <= 1.0


@pytest.mark.parametrize("mode", ["async", "eager", "gba"])
def test_a_shard_on_a_drained_node_moves_to_a_standby_and_loses_nothing(fake_ray, data,
                                                                         tmp_path, monkeypatch,
                                                                         mode):
    """Shard 1 is on a node of its own (told so: the harness has one node); that node drained,
    the shard's pushes pause, its checkpoint is written, a standby takes it over: the recovery
    is marked planned and loses no update and no push (eager's early pull, answered by the old
    process, is pushed to the new one; gba's partial global batch is applied first): both
    shards applied every sample's gradient."""
    from recsync.distributed.actors import RunActors
    other = "0dd0" * 14
    real = RunActors.shard_nodes
    monkeypatch.setattr(RunActors, "shard_nodes", lambda self: {
        **real(self), 1: other})
    cfg = config(data, f'mode="{mode}"', "cluster.workers=[1, 2]", "cluster.ps_shards=2",
                 f"data.chunk_rows={2 * B}", "train.epochs=8", "network.latency_ms=2",
                 'recovery.kind="partial"', "recovery.checkpoint_every_s=5",
                 'gba.decay="none"')
    out = tmp_path / "run"
    out.mkdir()

    def drain():
        _when(out, lambda ls: ls and ls[-1]["samples"] > 0)
        recsync.scale(out, drain_nodes=[other[:8]])

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    summary = run(cfg, out)
    thread.join(timeout=5)
    assert summary["status"] == "completed", summary["error"]
    moves = summary["elastic"]["shard_moves"]
    assert [m["shards"] for m in moves] == [[1]] and moves[0]["refused"] is None
    (rec,) = summary["recovery"]["recoveries"]
    assert rec["shard"] == 1 and rec["planned"] and rec["lost_updates"] == 0
    assert rec["version"] == rec["version_at_move"] > 0 and rec["downtime_s"] > 0
    assert summary["recovery"]["pls"] == 0 and summary["recovery"]["lost_pushes"] == 0
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0
    assert summary["samples"] == 8 * Dataset(data).rows("train")
    versions = [sh["version"] for sh in summary["per_shard"]]  # updates applied: the same
    assert versions[0] == versions[1], versions  # on both shards (every push reaches both)
    if mode != "gba":  # an update a push
        assert versions[0] == summary["samples"] // B


def test_chunks_given_back_after_the_others_are_done_are_trained_by_a_new_worker(
        fake_ray, data, tmp_path):
    """A slow worker dies holding a chunk after the other one ran out of data: the run does
    not end with it untrained (a new worker takes it)."""
    cfg = config(data, 'mode="async"', "cluster.workers=[1, 2]", "cluster.ps_shards=1",
                 "data.chunk_rows=2048", "train.epochs=1", "network.latency_ms=2",
                 'faults.stragglers=[{worker=1, factor=30}]',
                 'faults.kills=[{target="worker", index=1, at_step=32}]')  # worker 0 done
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed", summary["error"]
    q = summary["queue"]
    assert q["completed_never"] == 0 and q["completed"] == q["chunks"], q
    assert summary["samples"] >= Dataset(data).rows("train")
    assert [d["rank"] for d in summary["elastic"]["deaths"]] == [1]


def test_a_sync_formation_that_fails_part_way_rebuilds_the_group(fake_ray, data, tmp_path,
                                                                monkeypatch):
    """The gloo group cannot be formed again (here: the formation at 4 -> 2 raises, as a member
    dying or a store timing out would): the group is rebuilt from a member's replica at the
    step the PS completed, without the leavers (their chunks handed over), and completes."""
    from recsync.distributed import regroup
    calls = []
    real = regroup.form_group

    def fails_once(actors, ranks):  # the formation that shrinks the group (4 -> 2) fails
        calls.append(list(ranks))
        if len(calls) > 1 and len(ranks) < len(calls[-2]):
            raise RuntimeError("[test] the store timed out")
        return real(actors, ranks)

    monkeypatch.setattr(regroup, "form_group", fails_once)
    cfg = config(data, 'mode="sync"', "cluster.workers=[2, 4]", "cluster.ps_shards=2",
                 f"data.chunk_rows={2 * B}", "train.epochs=8", "network.latency_ms=2")
    summary, out = _run_scaled(cfg, tmp_path, 4, [2])
    assert calls[-1] == [0, 1]  # then the rebuild formed the group of the two (actors.spawn)
    e = summary["elastic"]
    last = e["formations"][-1]
    assert last["rebuilt"] and len(last["members"]) == 2
    assert len(e["drains"]) == 2 and e["deaths"] == []  # they had handed their chunks over
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0
    assert summary["samples"] >= 8 * Dataset(data).rows("train")
    assert "forming the group again failed" in (out / "metrics.jsonl").read_text()
