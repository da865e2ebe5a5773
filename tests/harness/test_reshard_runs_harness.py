"""Resuming onto another number of PS shards and workers: a run of 2 shards stops half way
(train.max_steps) after its checkpoint; runs of 3 and of 1 shard go on from that checkpoint.
What the new shards hold right after the restore (their first checkpoint, taken before any
worker starts) equals what the old ones saved, row by row by global id; then the run
completes, every chunk done exactly once."""

import shutil

import numpy as np
import pytest

from recsync.checkpoint import files, job, reshard
from recsync.data.reader import Dataset
from recsync.distributed.train import run_distributed
from recsync.metrics.core import MetricsLog
from harness_config import B, config


def _held(root, job_sequence):
    """Rows and state by (table, global id), and shard 0's dense arrays, of the shard
    checkpoints job checkpoint ``job_sequence`` names (their chains resolved)."""
    ckpt = files.load(files.manifest_path(job.job_dir(root), job_sequence))
    sequences = ckpt.meta["shard_sequences"]
    sources = [(job.shard_dir(root, k), seq) for k, seq in enumerate(sequences)]
    rows, dense = {}, {}
    for k, (arrays, meta) in enumerate(reshard.load_resolved(sources)):
        for t in range(meta["tables"]):
            ids = arrays[f"t{t}.local"] * len(sequences) + k
            for i, gid in enumerate(ids):
                rows[t, int(gid)] = (arrays[f"t{t}.weights"][i], arrays[f"t{t}.state"][i])
        if k == 0:
            dense = {n: a for n, a in arrays.items() if n.startswith("dense.")}
    return ckpt, rows, dense


def _run(cfg, out, resume=None):
    out.mkdir(exist_ok=True)
    return run_distributed(cfg, Dataset(cfg.data.path), MetricsLog(out / "metrics.jsonl"),
                           out, resume)


@pytest.mark.parametrize("mode,after", [("gba", [(3, 3), (1, 1)]), ("sync", [(3, 1)])])
def test_resume_onto_other_shards_restores_every_row_and_goes_on(fake_ray, data, tmp_path,
                                                                  mode, after):
    common = [f'mode="{mode}"', f"data.chunk_rows={4 * B}", "recovery.checkpoint_every_s=1000"]
    first = tmp_path / "first"
    _run(config(data, *common, "cluster.workers=2", "cluster.ps_shards=2",
                "train.max_steps=8"), first)
    final = files.latest(job.job_dir(first / "checkpoints"))
    assert final.meta["queue"]["pending"]  # half way: chunks left to train
    ds = Dataset(data)
    chunks = len(ds.chunks("train", 4 * B))
    for shards, workers in after:
        out = tmp_path / f"to-{shards}-{workers}"
        shutil.copytree(first, out)
        root = out / "checkpoints"
        saved, rows, dense = _held(root, final.sequence)
        assert len(saved.meta["shard_sequences"]) == 2 and len(rows) > 50
        cfg = config(data, *common, f"cluster.workers={workers}",
                     f"cluster.ps_shards={shards}")
        result = _run(cfg, out, files.latest(job.job_dir(root)))
        # the job checkpoint right after the restore: the new shards' state, the old position
        ckpt, restored, restored_dense = _held(root, final.sequence + 1)
        assert len(ckpt.meta["shard_sequences"]) == shards
        assert ckpt.meta["queue"]["pending"] == saved.meta["queue"]["pending"]
        assert ckpt.meta["samples"] == saved.meta["samples"]
        assert ckpt.meta["step_index"] == saved.meta["step_index"]
        assert sorted(restored) == sorted(rows)
        for key, (row, state) in rows.items():
            np.testing.assert_array_equal(restored[key][0], row, err_msg=str(key))
            np.testing.assert_array_equal(restored[key][1], state, err_msg=str(key))
        assert sorted(restored_dense) == sorted(dense)  # gba: shard 0's; sync: none
        for name, a in dense.items():
            np.testing.assert_array_equal(restored_dense[name], a, err_msg=name)
        if mode == "sync":  # the workers' dense replica and its optimizer state
            for name, a in saved.arrays.items():
                np.testing.assert_array_equal(ckpt.arrays[name], a, err_msg=name)
            assert "dense.opt.sum" in saved.arrays
        # then training goes on to the end, every chunk once
        queue = result["queue"]
        assert queue["completed"] == chunks
        assert queue["completed_more_than_once"] == 0 and queue["completed_never"] == 0
        assert result["record"].samples == ds.rows("train")
        assert len(result["shards"]) == shards and 0.5 < result["eval"]["auc"] <= 1.0
