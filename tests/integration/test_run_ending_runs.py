"""Ray end to end, once: a PS shard killed at the last step of a run (as training ends, before
the final checkpoint round, the gathering of the trained rows and the final evaluation) is
recovered (async, partial recovery: the process Ray restarts). Every mode, full recovery, and
the run that fails in one line without recovery: tests/harness/test_run_ending_runs_harness.py;
the kills during the end's later calls: tests/unit/test_run_ending.py.

One epoch of the session's data is 32 steps a worker (4,096 rows, batch 64, 2 workers: sync
steps both workers together; async hands out chunks, so the most advanced worker reaches 32
in the last steps or at the end). A kill at the most advanced worker's step 32 is made in the
last steps or, at the latest, at the poll that sees every worker done (distributed/watch.py).
"""

import pytest

from recsync.data.reader import Dataset
from recsync.model_dir import read_model_dir
from recsync.run.driver import run
from runs import config

LAST_STEP = 32


@pytest.mark.parametrize("mode, kind", [("async", "partial")])
def test_a_shard_killed_at_the_last_step_is_recovered_and_the_model_written(
        ray_cluster, data, tmp_path, mode, kind):
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=1", f'recovery.kind="{kind}"', "recovery.checkpoint_every_s=1.0",
                 f'faults.kills=[{{target="ps", index=1, at_step={LAST_STEP}}}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed", summary["error"]
    assert [f["event"] for f in summary["failures"]] == ["killed ps 1"]
    rec = summary["recovery"]
    assert [(r["kind"], r["shard"]) for r in rec["recoveries"]] == [(kind, 1)]
    assert rec["final_job_checkpoint"] is not None
    queue = summary["queue"]
    assert queue["completed_more_than_once"] == 0 and queue["pending"] == 0
    assert summary["samples"] == Dataset(data).rows("train")
    model = read_model_dir(tmp_path / "model")
    assert model.meta["run"]["mode"] == mode
    # id % 2 is its shard: a partial recovery from the shard's checkpoint of version 0 (taken
    # before training) keeps none of the rows it trained since (lost, as PLS counts them)
    first = rec["recoveries"][0]
    lost_all = kind == "partial" and first["version"] == 0
    assert not lost_all or first["lost_updates"] > 0
    assert {int(i) % 2 for ids, _, _ in model.tables for i in ids} == ({0} if lost_all
                                                                       else {0, 1})
    assert 0.0 < summary["eval"]["auc"] <= 1.0


