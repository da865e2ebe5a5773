"""Scenario `chaos`'s accounting on a run of the runtime harness: a worker and a PS shard
killed (twice each, the second kill of each due while its process is still down from the
first) in async with partial recovery; every kill is survived and every chunk is done exactly once.

Run: pytest -q tests/harness/test_chaos_harness.py
"""

import json

import pytest

from recsync.bench import chaos
from recsync.config import load_config
from recsync.data.reader import Dataset
from recsync.run.driver import run

pytestmark = pytest.mark.slow
B = 64


def test_a_run_under_kills_is_accounted_from_its_summary(fake_ray, data, tmp_path):
    kills = ('[{target="worker", index=1, at_s=1.0}, {target="worker", index=1, at_s=1.2}, '
             '{target="ps", index=1, at_s=1.4}, {target="ps", index=1, at_s=1.6}]')
    cfg = load_config(None, [
        f"data.path={json.dumps(str(data))}", "model.embedding_dim=4", "model.bottom_mlp=[8]",
        "model.top_mlp=[8]", f"train.batch_size={B}", "output.progress=false",
        "output.plot=false", 'cluster.transport="ray"', 'mode="async"', "cluster.workers=2",
        "cluster.ps_shards=2",
        f"data.chunk_rows={4 * B}", "train.epochs=8", 'recovery.kind="partial"',
        "recovery.checkpoint_every_s=1.0", f"faults.kills={kills}"])
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    a = chaos.account(summary, workers=2)
    # each second kill waited until its process was back, so each killed a process
    assert (a["kills_made"], a["kills_made_workers"], a["kills_made_shards"]) == (4, 2, 2)
    assert a["kills_survived"] == 4
    times = {(k["target"], k["time_s"]): k["recovered_s"] for k in a["kills"]}
    worker_kills = sorted(t for target, t in times if target == "worker")
    assert times["worker", worker_kills[0]] < worker_kills[1]  # back before killed again
    assert len(summary["recovery"]["recoveries"]) == 2
    assert len(summary["recovery"]["worker_restarts"]) == 2
    assert a["chunks_not_exactly_once"] == 0
    assert summary["queue"]["chunks"] == summary["queue"]["completed"] == 8 * len(
        Dataset(data).chunks("train", 4 * B))
    # two worker deaths gave back at most a lease each, of at most 4 batches
    assert summary["queue"]["released"] <= 2 and a["rows_requeued"] <= 2 * 4 * B
    assert 0 <= a["pls"] < 0.5
