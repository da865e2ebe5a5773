"""train.init_from in distributed modes: before the first update (the checkpoint round taken
before the workers start) the shards hold the model directory's rows and row state by global
id, and the dense parameters with their optimizer state (shard 0's where the PS holds them, the
workers' replica in sync); one step from there is the local run's one step from there."""

import json

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

from model_dirs import write_model_dir
from recsync.checkpoint import files, job, reshard
from recsync.data.reader import Dataset
from recsync.distributed.train import run_distributed
from recsync.metrics.core import MetricsLog
from recsync.run.driver import run
from recsync.run.local_run import build_local_model, train_step
from recsync.run.warm_start import load_warm_start
from harness_config import B, config


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_distributed_run_starts_from_the_model_directory(fake_ray, data, tmp_path, mode):
    ds = Dataset(data)
    cfg = config(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    for k in range(3):
        train_step(model, ds.read(ds.chunks("train", B)[k]))
    written = write_model_dir(tmp_path / "model", cfg, model)
    init = f"train.init_from={json.dumps(str(tmp_path / 'model'))}"
    cfg = config(data, f'mode="{mode}"', init, "cluster.workers=1", "cluster.ps_shards=2",
                 "train.max_steps=1", "recovery.checkpoint_every_s=1000")
    out = tmp_path / "run"
    out.mkdir()
    result = run_distributed(cfg, ds, MetricsLog(out / "metrics.jsonl"), out,
                             warm=load_warm_start(cfg, ds))
    root = out / "checkpoints"
    first = files.load(files.manifest_path(job.job_dir(root), 1))  # before the workers start
    sources = [(job.shard_dir(root, k), s) for k, s in enumerate(first.meta["shard_sequences"])]
    held = list(reshard.load_resolved(sources))
    for t, (ids, rows, state) in enumerate(written["tables"]):
        for k, (arrays, _) in enumerate(held):
            mine = ids % 2 == k
            np.testing.assert_array_equal(arrays[f"t{t}.local"], (ids[mine] // 2).numpy())
            np.testing.assert_array_equal(arrays[f"t{t}.weights"], rows[mine].numpy())
            np.testing.assert_array_equal(arrays[f"t{t}.state"], state[mine].numpy())
    dense = held[0][0] if mode == "async" else first.arrays
    np.testing.assert_array_equal(dense["dense.params"],
                                  parameters_to_vector(model.dense.parameters()).detach())
    np.testing.assert_array_equal(dense["dense.opt.sum"], written["optimizer"]["sum"].numpy())
    # one step from there is the local run's one step from the same model
    local = run(config(data, init, "train.max_steps=1"), tmp_path / "local")
    assert result["eval"]["logloss"] == pytest.approx(local["eval"]["logloss"], abs=1e-6)
    assert not torch.equal(torch.from_numpy(dense["dense.params"]),
                           parameters_to_vector(result["model"].dense.parameters()).detach())
