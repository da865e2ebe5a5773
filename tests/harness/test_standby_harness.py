"""Warm standby PS shards (recovery.standby_shards, ps/standby.py): a standby takes a dead
shard's place with the rows and version of its last complete checkpoint, a dead standby is
passed over, a shard killed while its checkpoint is being written comes back from the one
before, and runs where a standby is killed, two shards fail within a second, or a shard dies in
the middle of a checkpoint write, complete every chunk exactly once."""

import time

import numpy as np
import pytest
import ray
from torch.nn.utils import parameters_to_vector

from recsync.checkpoint import files, job
from recsync.data.reader import Dataset
from recsync.model.setup import model_for
from recsync.ps.standby import start_shards
from recsync.run.driver import run
from harness_config import config

RECOVERY = ['mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
            'recovery.kind="partial"', "recovery.checkpoint_every_s=1.0"]


def started(data, tmp_path, dense_init=None):
    """The shards and the directory of a partial-recovery config, outside a run."""
    cfg = config(data, *RECOVERY)
    built = model_for(cfg.model, Dataset(data))
    if dense_init is None:
        dense_init = parameters_to_vector(built.module.parameters()).detach().numpy()
    shards, _, directory, _ = start_shards(cfg, built.tables, dense_init, tmp_path)
    return built.tables, shards, directory


def push(shard, tables, ids, version_read=0):
    """One push of gradient 1 to rows ``ids`` of table 0 (the other tables untouched)."""
    ids_ = [np.array(ids if t == 0 else [], np.int64) for t in range(len(tables))]
    grads = [np.ones((len(i), spec.dim), np.float32) for i, spec in zip(ids_, tables)]
    meta = {"version_read": version_read, "lr_scale": 1.0, "sampled": None}
    return ray.get(shard.push.remote(ids_, grads, None, meta))


def killed(handle) -> None:
    """Kill a shard's process (as fault injection does) and wait until Ray knows it is dead."""
    handle.die.remote()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            ray.get(handle.incarnation.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the shard's process did not die")


def stop(directory) -> None:
    """The shards, standbys and directory a test started, gone from the session's Ray."""
    for h in [*ray.get(directory.handles.remote()), *ray.get(directory.standby_handles.remote())]:
        ray.kill(h)
    ray.kill(directory)


def test_a_standby_takes_over_a_dead_shard_with_its_checkpoints_rows_and_version(
        fake_ray, data, tmp_path):
    tables, shards, directory = started(data, tmp_path)
    old = shards[1]
    for _ in range(3):
        push(old, tables, [1, 3, 5])
    saved = ray.get(old.checkpoint.remote())
    ray.get(old.checkpoints_written.remote())
    rows_then = ray.get(old.trained_rows.remote(True))
    push(old, tables, [1, 7])  # after the checkpoint: lost with the process
    assert ray.get(old.incarnation.remote())["version"] == saved["version"] + 1
    killed(old)
    new = ray.get(directory.current.remote(1))
    inc = ray.get(new.incarnation.remote())
    assert inc["pid"] != saved["pid"]
    assert inc["restored"]["sequence"] == saved["sequence"]
    assert inc["version"] == saved["version"] == 3
    for before, after in zip(rows_then, ray.get(new.trained_rows.remote(True))):
        np.testing.assert_array_equal(after.ids, before.ids)
        np.testing.assert_array_equal(after.rows, before.rows)
        np.testing.assert_array_equal(after.state, before.state)
    assert ray.get(directory.current.remote(1)) == new  # alive: the same one, no take-over
    (report,) = ray.get(directory.report.remote())
    assert report["shard"] == 1 and report["pid"] == inc["pid"] and report["passed_over"] == []
    assert len(ray.get(directory.standby_handles.remote())) == 1  # a new one is waiting
    push(new, tables, [9], version_read=inc["version"])  # and it serves
    stop(directory)


def test_a_dead_standby_is_passed_over_and_a_new_one_takes_over(fake_ray, data, tmp_path):
    tables, shards, directory = started(data, tmp_path)
    push(shards[0], tables, [0, 2])
    ray.get(shards[0].checkpoint.remote())
    ray.get(shards[0].checkpoints_written.remote())
    (standby,) = ray.get(directory.standby_handles.remote())
    assert ray.get(standby.incarnation.remote())["version"] is None  # holds no shard yet
    killed(standby)
    killed(shards[0])
    new = ray.get(directory.current.remote(0))
    assert ray.get(new.incarnation.remote())["version"] == 1
    (report,) = ray.get(directory.report.remote())
    assert len(report["passed_over"]) == 1  # the dead standby
    stop(directory)


def test_a_shard_killed_while_writing_a_checkpoint_comes_back_from_the_one_before(
        fake_ray, data, tmp_path):
    # shard 0 holds a dense vector of 16M floats (and its optimizer state): its checkpoint
    # takes long enough to write that the kill lands in the middle
    tables, shards, directory = started(data, tmp_path, np.zeros(16 * 2**20, np.float32))
    shard = shards[0]
    push(shard, tables, [0])
    first = ray.get(shard.checkpoint.remote())
    ray.get(shard.checkpoints_written.remote())
    push(shard, tables, [2])
    second = ray.get(shard.checkpoint.remote())  # returns once copied; written in the background
    killed(shard)
    written = files.manifests(job.shard_dir(tmp_path, 0))  # the second never completed
    assert files.manifest_path(job.shard_dir(tmp_path, 0), second["sequence"]) not in written
    new = ray.get(directory.current.remote(0))
    inc = ray.get(new.incarnation.remote())
    assert inc["restored"]["sequence"] == first["sequence"]
    assert inc["version"] == first["version"] == 1
    stop(directory)


# A kill at a step is made at the driver's poll (every 0.5 s) after the first metrics line at
# that step or later; one epoch is 32 steps a worker (test_runtime.py's KILL_STEP: when such a
# kill comes, and why 5 epochs leave the recovery room). standby_killed_first: the standby at
# step 16, the shard at 80, polls apart up to ~100 steps/s a worker (a line every 0.5-0.6 s
# falls between them); at ~35 steps/s they come at 1.0-1.6 s and 2.8-3.4 s (steps 98-119, where
# the at_s = 3.0 they replace came at 105-122), and 7 epochs (224 steps) leave 100 steps after
# the shard's kill (60 at 70 steps/s). two_shards_within_a_second: steps 16 and 17, at the same
# poll or the next one (that poll's line has the workers past 17), within a second either way.
# killed_while_writing stays at a time: armed at a step, the kill would still wait for the next
# checkpoint round, due every second of training, so the run has to outlive a time anyway (one
# epoch less at most).
@pytest.mark.parametrize("kills, recoveries, epochs", [
    ('[{target="standby", index=0, at_step=16}, {target="ps", index=1, at_step=80}]', [1], 7),
    ('[{target="ps", index=0, at_step=16}, {target="ps", index=1, at_step=17}]', [0, 1], 5),
    ('[{target="ps", index=1, at_s=2.0, during="checkpoint_write"}]', [1], 10),
], ids=["standby_killed_first", "two_shards_within_a_second", "killed_while_writing"])
def test_runs_with_standbys_complete_every_chunk_exactly_once(fake_ray, data, tmp_path,
                                                              kills, recoveries, epochs):
    cfg = config(data, *RECOVERY, f"train.epochs={epochs}", f"faults.kills={kills}",
                 "recovery.keep=1000")  # every checkpoint kept: what a standby loaded is read
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    rec = summary["recovery"]
    assert sorted(r["shard"] for r in rec["recoveries"]) == recoveries
    for r in rec["recoveries"]:
        assert r["standby"] and r["downtime_to"] == "first pull served"
        assert r["downtime_s"] > 0
        saved = files.chain(job.shard_dir(tmp_path / "checkpoints", r["shard"]), r["sequence"])
        assert saved[-1].meta["version"] == r["version"]  # what the standby reloaded
        if "checkpoint_write" in kills:  # the write the death interrupted was passed over
            assert r["interrupted"] and min(r["interrupted"]) > r["sequence"]
    queue = summary["queue"]
    assert queue["completed_more_than_once"] == 0 and queue["pending"] == 0
    assert summary["samples"] == epochs * Dataset(data).rows("train")
