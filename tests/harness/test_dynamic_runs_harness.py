"""Dynamic tables (issue 33) in runs: every mode and the local run train a data set whose tables
are dynamic (ids = the values' full 64-bit hashes), with rows admitted, evicted and expired as
configured; the model directory scores as the run evaluated; a run resumes onto another number
of shards with every row back under its id."""

import shutil

import numpy as np
import pytest
import torch

from recsync.checkpoint import files, job, reshard
from recsync.data.convert import convert
from recsync.data.reader import Dataset
from recsync.distributed.train import run_distributed
from recsync.metrics.core import MetricsLog
from recsync.model_dir.read import read_model_dir
from recsync.modes import MODES
from recsync.run.driver import run
from dynamic_data import SCHEMA
from harness_config import B, config

def model_dir_auc(model_dir, data) -> float:
    """The eval split's AUC as a run's model directory scores it."""
    from sklearn.metrics import roc_auc_score

    from recsync.model_dir.trained import load_model
    trained, ds = load_model(model_dir), Dataset(data)
    batches = [ds.read(chunk) for chunk in ds.chunks("eval", 256)]
    return roc_auc_score(np.concatenate([b.label.numpy() for b in batches]),
                         np.concatenate([trained.score_batch(b) for b in batches]))


def _run(cfg, out, resume=None):
    out.mkdir(exist_ok=True)
    return run_distributed(cfg, Dataset(cfg.data.path), MetricsLog(out / "metrics.jsonl"),
                           out, resume)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_trains_dynamic_tables_within_their_capacity(fake_ray, dyn_data, tmp_path,
                                                                 mode):
    capacity = 150  # per shard: table a sees more values than 2 shards hold
    cfg = config(dyn_data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 f"model.dynamic.capacity={capacity}", "model.dynamic.admit_after=2",
                 "train.epochs=2")
    result = _run(cfg, tmp_path)
    assert 0.6 < result["eval"]["auc"] <= 1.0
    stats = [st["dynamic"] for st in result["shards"]]
    a = {k: sum(s["a"][k] for s in stats) for k in stats[0]["a"]}
    assert a["capacity"] == 2 * capacity and 0 < a["live"] <= a["capacity"]
    assert a["evicted"] > 0 and a["refused"] > 0  # admission after 2 sightings counted


def test_the_local_run_and_its_model_directory_score_alike(dyn_data, tmp_path):
    cfg = config(dyn_data, "model.dynamic.capacity=10000")
    summary = run(cfg, tmp_path / "out")
    assert summary["status"] == "completed"
    assert summary["dynamic_tables"]["a"]["evicted"] == 0
    model = read_model_dir(tmp_path / "out" / "model")
    kinds = [t.get("kind") for t in model.meta["tables"]]
    assert kinds == ["dynamic", "dynamic"]
    ids = model.tables[0][0]
    assert bool((ids < 0).any()) and bool((ids[1:] > ids[:-1]).all())  # 64-bit keys, sorted
    assert abs(model_dir_auc(tmp_path / "out" / "model", dyn_data)
               - summary["eval"]["auc"]) < 1e-6


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_resume_onto_three_shards_puts_every_row_back_under_its_id(fake_ray, dyn_data,
                                                                   tmp_path, mode):
    common = [f'mode="{mode}"', f"data.chunk_rows={4 * B}", "recovery.checkpoint_every_s=1000",
              "model.dynamic.capacity=5000", "cluster.workers=2"]
    first = tmp_path / "first"
    _run(config(dyn_data, *common, "cluster.ps_shards=2", "train.max_steps=12"), first)
    final = files.latest(job.job_dir(first / "checkpoints"))
    out = tmp_path / "to3"
    shutil.copytree(first, out)
    root = out / "checkpoints"

    def held(sequence):
        ckpt = files.load(files.manifest_path(job.job_dir(root), sequence))
        sources = [(job.shard_dir(root, k), s)
                   for k, s in enumerate(ckpt.meta["shard_sequences"])]
        rows = {}
        for arrays, meta in reshard.load_resolved(sources):
            for t in range(meta["tables"]):
                for i, key in enumerate(arrays[f"t{t}.ids"]):
                    rows[t, int(key)] = (arrays[f"t{t}.weights"][i], arrays[f"t{t}.state"][i],
                                         int(arrays[f"t{t}.counts"][i]))
        return ckpt, rows

    _, saved = held(final.sequence)
    assert len(saved) > 100
    result = _run(config(dyn_data, *common, "cluster.ps_shards=3"), out,
                  files.latest(job.job_dir(root)))
    ckpt, restored = held(final.sequence + 1)
    assert len(ckpt.meta["shard_sequences"]) == 3
    assert sorted(restored) == sorted(saved)
    for key, (row, state, count) in saved.items():
        np.testing.assert_array_equal(restored[key][0], row, err_msg=str(key))
        np.testing.assert_array_equal(restored[key][1], state, err_msg=str(key))
        assert restored[key][2] == count
    assert result["queue"]["completed_more_than_once"] == 0


def test_a_distributed_runs_evaluation_reads_what_its_model_directory_scores(fake_ray,
                                                                              dyn_data,
                                                                              tmp_path):
    """The final evaluation admits nothing: eval-only ids score with zeros, as the model
    directory scores them, so both give one AUC even on full tables."""
    cfg = config(dyn_data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "model.dynamic.capacity=100", "output.save_predictions=true")
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary["error"]
    assert abs(model_dir_auc(tmp_path / "run" / "model", dyn_data)
               - summary["eval"]["auc"]) < 1e-6


def test_a_warm_start_needs_the_tables_dynamic_in_both_runs_and_the_model_exports(dyn_data,
                                                                                  tmp_path):
    run(config(dyn_data, "model.dynamic.capacity=10000", "train.max_steps=5"), tmp_path / "dyn")
    model = tmp_path / "dyn" / "model"
    fixed = tmp_path / "fixed"
    (tmp_path / "fixed.toml").write_text(SCHEMA.replace('table_kind = "dynamic"',
                                                        'table_kind = "fixed"'))
    convert([dyn_data.parent / "rows.csv"], tmp_path / "fixed.toml", fixed, progress=False)
    with pytest.raises(ValueError, match="table a is dynamic in the model, fixed in this run"):
        run(config(fixed, f'train.init_from="{model}"'), tmp_path / "warm")
    with pytest.raises(ValueError, match="over model.dynamic.capacity 10"):
        run(config(dyn_data, f'train.init_from="{model}"', "model.dynamic.capacity=10"),
            tmp_path / "small")
    from recsync.model_dir.export import export_model
    from recsync.model_dir.trained import load_model
    export_model(model, tmp_path / "m.pt2", fmt="torch-export")  # tests/unit/test_export_dynamic
    ds = Dataset(dyn_data)
    batch = ds.read(ds.chunks("eval", 256)[0])
    args = (batch.dense, batch.sparse, *[t for pair in batch.multi for t in pair])
    got = torch.export.load(str(tmp_path / "m.pt2")).module()(*args)
    assert (got - load_model(model)(*args)).abs().max() <= 1e-6
