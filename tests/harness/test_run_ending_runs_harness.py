"""On the runtime harness: a PS shard killed at the last step of a run (as training ends,
before the final checkpoint round, the gathering of the trained rows and the final evaluation)
is recovered in every mode (partial recovery where the mode allows it; the lock-step modes,
sync and hybrid, and async once more: full recovery), and without recovery the run fails in
one line naming the shard and the moment (the kills during the end's later calls:
tests/unit/test_run_ending.py; once on Ray: tests/integration/test_run_ending_runs.py).

One epoch of the session's data is 32 steps a worker (4,096 rows, batch 64, 2 workers: sync
steps both workers together; async hands out chunks, so the most advanced worker reaches 32
in the last steps or at the end). A kill at the most advanced worker's step 32 is made in the
last steps or, at the latest, at the poll that sees every worker done (distributed/watch.py).
"""

import json

import pytest

from recsync.data.reader import Dataset
from recsync.distributed.errors import RunFailed
from recsync.model_dir import read_model_dir
from recsync.run.driver import run
from harness_config import config

LAST_STEP = 32


@pytest.mark.parametrize("mode, kind", [
    ("async", "partial"), ("async", "full"), ("gba", "partial"), ("eager", "partial"),
    ("shadow", "partial"), ("foreground", "partial"), ("sync", "full"), ("hybrid", "full")])
def test_a_shard_killed_at_the_last_step_is_recovered_and_the_model_written(
        fake_ray, data, tmp_path, mode, kind):
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


def test_without_recovery_a_shard_killed_at_the_last_step_fails_the_run_in_one_line(
        fake_ray, data, tmp_path):
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=1", f'faults.kills=[{{target="ps", index=1, at_step={LAST_STEP}}}]')
    with pytest.raises(RunFailed, match="shard 1 died"):
        run(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "\n" not in summary["error"]
    assert summary["error"].startswith("parameter-server shard 1 died")
    assert 'recovery.kind = "none"' in summary["error"]


@pytest.mark.parametrize("mode", ["async", "gba", "eager", "shadow", "foreground", "sync",
                                  "hybrid"])
def test_a_worker_killed_at_the_last_step_is_replaced_and_the_run_completes(
        fake_ray, data, tmp_path, mode):
    """The dead worker's leased chunk goes back to the queue and is trained by its successor
    (or, in sync and hybrid, by the rebuilt group): every chunk completed exactly once."""
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=1", f'faults.kills=[{{target="worker", index=1, '
                                   f'at_step={LAST_STEP}}}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed", summary["error"]
    assert [f["event"] for f in summary["failures"]] == ["killed worker 1"]
    queue = summary["queue"]
    assert queue["completed_more_than_once"] == 0 and queue["pending"] == 0
    assert queue["leased"] == 0
    assert summary["samples"] >= Dataset(data).rows("train")
    assert (tmp_path / "model").is_dir() and 0.0 < summary["eval"]["auc"] <= 1.0
