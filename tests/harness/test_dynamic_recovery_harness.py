"""Dynamic tables (issue 33) with CPR's partial checkpoints: a standby takes a dead shard over
with every row of its checkpoint chain back under its id and none of the rows evicted since
its base; runs with a shard killed go on from chains of partial checkpoints with a standby
(partial recovery, in every mode that has it) or by rolling every shard back (full recovery,
in a lock-step mode)."""

import numpy as np
import pytest
import ray

from recsync.checkpoint import files, job
from recsync.data.reader import Dataset
from recsync.model.setup import model_for
from recsync.ps.standby import start_shards
from recsync.run.driver import run
from harness_config import config
from test_standby_harness import killed, stop

CPR = ['mode="async"', "cluster.workers=2", "cluster.ps_shards=2", 'recovery.kind="partial"',
       "recovery.checkpoint_every_s=0.25", "model.dynamic.admit_after=1"]


def step(shard, tables, ids, version_read=0):
    """A worker's step on rows ``ids`` of table 0 (dynamic): a pull, which admits them, and a
    push of gradient 1."""
    ids_ = [np.array(ids if t == 0 else [], np.int64) for t in range(len(tables))]
    ray.get(shard.pull.remote(ids_))
    grads = [np.ones((len(i), spec.dim), np.float32) for i, spec in zip(ids_, tables)]
    meta = {"version_read": version_read, "lr_scale": 1.0, "sampled": None}
    return ray.get(shard.push.remote(ids_, grads, None, meta))


def by_id(shard) -> dict[int, tuple]:
    rows = ray.get(shard.trained_rows.remote(True))[0]
    return {int(i): (r, s) for i, r, s in zip(rows.ids, rows.rows, rows.state)}


def test_a_standby_takes_over_a_dynamic_shard_from_its_chain_without_the_evicted_rows(
        fake_ray, dyn_data, tmp_path):
    cfg = config(dyn_data, *CPR, 'recovery.rows="mfu"', "recovery.mfu_fraction=1.0",
                 "recovery.full_every=10", "model.dynamic.capacity=8")
    tables = model_for(cfg.model, Dataset(dyn_data)).tables
    assert tables[0].dynamic is not None
    shards, _, directory, _ = start_shards(cfg, tables, None, tmp_path)
    old = shards[1]
    for _ in range(2):
        step(old, tables, list(range(1, 17, 2)))  # 8 odd ids fill the capacity
    base = ray.get(old.checkpoint.remote())
    for _ in range(3):
        step(old, tables, [17, 19, 21])  # 3 rows evicted for them
    saved = ray.get(old.checkpoint.remote())
    ray.get(old.checkpoints_written.remote())
    rows_then = by_id(old)
    step(old, tables, [23])  # after the checkpoint: lost with the process
    killed(old)
    new = ray.get(directory.current.remote(1))
    inc = ray.get(new.incarnation.remote())
    assert inc["restored"]["sequence"] == saved["sequence"] and inc["restored"]["chain"] == 2
    partial = files.load(files.manifest_path(job.shard_dir(tmp_path, 1), saved["sequence"]))
    assert partial.meta["partial"] == "mfu" and partial.meta["base"] == base["sequence"]
    gone = partial.arrays["t0.gone"].tolist()
    assert len(gone) == 3 and not set(gone) & set(rows_then)  # evicted since the base
    restored = by_id(new)
    assert sorted(restored) == sorted(rows_then) and len(restored) == 8
    for key, (row, state) in rows_then.items():
        np.testing.assert_array_equal(restored[key][0], row, err_msg=str(key))
        np.testing.assert_array_equal(restored[key][1], state, err_msg=str(key))
    step(new, tables, [23], version_read=inc["version"])  # and it serves
    stop(directory)


@pytest.mark.parametrize("mode, kind, rows", [
    ("async", "partial", "mfu"), ("gba", "partial", "ssu"), ("eager", "partial", "mfu"),
    ("shadow", "partial", "ssu"), ("sync", "full", "all")])
def test_runs_with_a_shard_killed_go_on_from_the_checkpoints_of_dynamic_tables(
        fake_ray, dyn_data, tmp_path, mode, kind, rows):
    """Every mode whose shards recover alone (partial recovery) and a lock-step one (full
    recovery, which takes full checkpoints only: every shard rolls back by id)."""
    cfg = config(dyn_data, *CPR, f'mode="{mode}"', f'recovery.kind="{kind}"',
                 f'recovery.rows="{rows}"',
                 "recovery.mfu_fraction=0.5", "recovery.ssu_rate=0.5", "recovery.full_every=4",
                 "recovery.keep=1000", "model.dynamic.capacity=100", "train.epochs=12",
                 # full at 0 s, partial at 0.25, 0.5 and 0.75 s: the kill restores a chain (early:
                 # on a fast machine the 12 epochs took under 3 s, and no kill came)
                 'faults.kills=[{target="ps", index=1, at_s=0.9}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed", summary.get("error")
    rec = summary["recovery"]
    [recovery] = rec["recoveries"]
    assert recovery["shard"] == 1
    a = summary["dynamic_tables"]["a"]  # summed over the shards
    assert a["evicted"] > 0 and 0 < a["live"] <= a["capacity"] == 200
    if kind == "partial":
        assert rec["rows"] == rows and rec["partial_checkpoints"] > 0
        assert recovery["standby"] and recovery["chain"] >= 2
        tombstones = [c.arrays["t0.gone"] for c in map(files.load, files.manifests(
            job.shard_dir(tmp_path / "checkpoints", 1))) if c.meta["partial"]]
        assert tombstones and sum(len(g) for g in tombstones) > 0
    else:
        assert rec["samples_redone"] > 0 and rec["pls"] == 0
    assert summary["queue"]["completed_more_than_once"] == 0
    assert 0.6 < summary["eval"]["auc"] <= 1.0
