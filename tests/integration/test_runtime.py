"""Ray end to end, once per mode family and fault kind: sync equals local training on the
global batch (gloo's all-reduce), gba and shadow complete every chunk once, a killed sync worker
is replaced on a new group, a killed shard comes back from a standby or from Ray's restart of
its process (partial recovery; the latter from CPR-MFU checkpoints of dynamic tables) and from
Ray's restart (full recovery), and `recsync train --resume` after the driver is killed.
Every mode and the rest (switching, checkpoint rounds, the interval's choice, a dead shard
without recovery, ...): tests/harness, on the same actors without Ray. (That no process
outlives a run: test_loopback.py for a completed run, test_endings.py for the other endings.)

Run: .venv/bin/pytest -q tests/integration
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import ray  # noqa: F401  (before psutil: it puts the psutil it bundles on sys.path)
import psutil
import torch
from torch.nn.utils import parameters_to_vector

from recsync.checkpoint import files, job
from recsync.data.reader import Batch, Dataset
from recsync.distributed.train import run_distributed
from recsync.metrics.core import MetricsLog
from recsync.run.driver import run
from recsync.run.local_run import build_local_model, train_step
from runs import B, config


def test_sync_two_workers_equal_local_with_the_global_batch(ray_cluster, data, tmp_path):
    _equals_local_with_the_global_batch(data, tmp_path, 'mode="sync"')


def _equals_local_with_the_global_batch(data, tmp_path, *mode):
    steps = 6
    cfg = config(data, *mode, "cluster.workers=2", "cluster.ps_shards=2",
                 f"data.chunk_rows={B}", "data.shuffle=false", f"train.max_steps={steps}",
                 'train.dense_precision="float32"')  # an equality: bfloat16 rounds per batch
    result = run_distributed(cfg, Dataset(data), MetricsLog(tmp_path / "m.jsonl"))
    ds = Dataset(data)
    local = build_local_model(cfg.model, cfg.train, ds)
    touched = []
    for k in range(steps):  # global batch k = worker 0's k-th chunk + worker 1's k-th chunk
        parts = [ds.read(result["taken"][w][k][1]) for w in (0, 1)]
        batch = Batch(*(torch.cat([getattr(p, f) for p in parts]) for f in ("dense", "sparse",
                                                                           "label")))
        assert len(batch) == 2 * B
        train_step(local, batch)
        touched.append(batch.sparse)
    sync_dense = parameters_to_vector(result["model"].dense.parameters())
    local_dense = parameters_to_vector(local.dense.parameters())
    torch.testing.assert_close(sync_dense, local_dense, rtol=1e-5, atol=1e-6)
    ids = torch.cat(touched)
    with torch.no_grad():
        sync_rows = result["model"].lookup.pull(ids).embeddings().stacked
        local_rows = local.lookup.pull(ids).embeddings().stacked
    torch.testing.assert_close(sync_rows, local_rows, rtol=1e-5, atol=1e-6)
    assert sync_rows.abs().sum() > 0 and not torch.equal(sync_rows, torch.zeros_like(sync_rows))


@pytest.mark.parametrize("mode", ["gba", "shadow"])  # every mode: tests/harness
def test_ps_modes_complete_every_chunk_exactly_once(ray_cluster, data, tmp_path, mode):
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 f"data.chunk_rows={4 * B}", "train.epochs=2", "shadow.hogwild_threads=2",
                 "shadow.foreground_every=3")
    summary = run(cfg, tmp_path)
    ds = Dataset(data)
    chunks = len(ds.chunks("train", 4 * B))
    assert summary["status"] == "completed"
    assert summary["samples"] == 2 * ds.rows("train")
    assert sum(w["chunks"] for w in summary["per_worker"]) == 2 * chunks
    assert summary["staleness"]["max"] is not None and summary["staleness"]["mean"] >= 0
    assert 0.5 < summary["eval"]["auc"] <= 1.0
    assert summary["emulation"] is None  # no pacing unless [emulation] asks for it
    if mode == "gba":  # every gradient reached both shards and went into an update
        steps = sum(w["steps"] for w in summary["per_worker"])
        gba = summary["gba"]
        assert gba["applied"] + gba["dropped"] == 2 * steps
        for shard in gba["per_shard"]:  # M = 2 gradients an update, the last one partial
            assert shard["updates"] == -(-shard["applied"] // 2)
    if mode == "eager":  # every step's push reached every shard and was applied
        steps = sum(w["steps"] for w in summary["per_worker"])
        assert [sh["pushes"] for sh in summary["per_shard"]] == [steps, steps]
        assert [sh["version"] for sh in summary["per_shard"]] == [steps, steps]
        eager = summary["eager"]
        assert eager["multiplier"]["updates"] == 2 * steps and eager["tau"]["max"] >= 1
        assert eager["iteration_s"]["compute"] > 0
    if mode in ("shadow", "foreground"):  # 2 Hogwild threads a worker, MA between workers
        sh = summary["shadow"]
        assert sh["threads_left_running"] == 0 and sh["hogwild_threads"] == 2
        assert all(n > 0 for n in sh["syncs"]) and sh["sync_gap"]["mean"] is not None
        if mode == "foreground":
            assert sh["sync_gap"]["max"] == 3


@pytest.mark.parametrize("mode", ["sync"])  # every mode: tests/harness
def test_a_killed_worker_is_replaced_and_every_chunk_completes_once(ray_cluster, data, tmp_path,
                                                                      mode):
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 f"data.chunk_rows={2 * B}", "train.epochs=3",
                 'faults.kills=[{target="worker", index=1, at_s=1.0}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    assert [f["event"] for f in summary["failures"]] == ["killed worker 1"]
    queue = summary["queue"]
    chunks = len(Dataset(data).chunks("train", 2 * B))
    assert queue["completed"] == 3 * chunks and queue["completed_more_than_once"] == 0
    assert queue["pending"] == 0 and queue["leased"] == 0
    # every row trained once at least (a chunk the dead worker had started, again): its
    # chunks completed after the driver's last poll of it count
    assert summary["samples"] >= 3 * Dataset(data).rows("train")
    assert 0.5 < summary["eval"]["auc"] <= 1.0


# A shard killed at a step for the recovery runs, and their length. One epoch of the session's
# data is 32 steps a worker (4,096 rows, batch 64, 2 workers). The kill is made at the driver's
# poll (every 0.5 s) after the first metrics line at KILL_STEP or later: at the ~35 steps/s a
# worker of a loaded 2-core machine, the second or third poll, 1.0-1.6 s of training, 35-55
# steps. Every checkpoint the assertions need is there by then: the round at the start (shard
# sequence 1, job checkpoint 1), perhaps the one at 1 s. A dead shard stops the workers at their
# next pull, so the recovery happens whatever is left of the run, as long as the kill comes
# before the last steps: 5 epochs (160 steps) leave 100 or more after it at 35 steps/s, 48 or
# more at 70 (the kill at 3.0 s of 10 epochs was 33-39% into the run at 35 steps/s, 66-79% at
# 70; now 22-35% and 44-70%).
KILL_STEP, KILL_EPOCHS = 16, 5


# dynamic: tables keyed by 64-bit ids (tests/dynamic_data.py: 19 steps an epoch a worker, so 8
# epochs where the synthetic data's 32 take 5), CPR-MFU checkpoints every 0.5 s (partial ones
# after the first), rows evicted between them
DYNAMIC = ['recovery.rows="mfu"', "recovery.full_every=4", "recovery.mfu_fraction=0.5",
           "model.dynamic.capacity=100", "model.dynamic.admit_after=1"]


@pytest.mark.parametrize("mode, shard, standbys, dynamic", [("async", 1, 1, False),
                                                            ("async", 1, 0, True)],
                         ids=["standby", "ray_restart_dynamic_mfu"])  # shadow: tests/harness
def test_partial_recovery_restarts_a_killed_shard_from_its_checkpoint_and_goes_on(
        ray_cluster, request, tmp_path, mode, shard, standbys, dynamic):
    """(shadow: EASGD, whose center copy is on the shard killed; without a standby: Ray
    restarts the shard's process, which reloads its chain)"""
    data = request.getfixturevalue("dyn_data" if dynamic else "data")
    epochs = 8 if dynamic else KILL_EPOCHS
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 'shadow.algorithm="easgd"',
                 f"train.epochs={epochs}", 'recovery.kind="partial"',
                 f"recovery.checkpoint_every_s={0.5 if dynamic else 1.0}",
                 f"recovery.standby_shards={standbys}",
                 f'faults.kills=[{{target="ps", index={shard}, at_step={KILL_STEP}}}]',
                 *(DYNAMIC if dynamic else []))
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    rec = summary["recovery"]
    assert rec["kind"] == "partial" and len(rec["recoveries"]) == 1
    recovery = rec["recoveries"][0]
    assert recovery["shard"] == shard and recovery["sequence"] >= 1
    assert recovery["standby"] == bool(standbys)
    # from the kill to the first pull the new process served
    assert recovery["downtime_to"] == "first pull served" and recovery["downtime_s"] > 0
    assert 0 < rec["pls"] < 0.5
    assert [f["event"] for f in summary["failures"]] == [f"killed ps {shard}"]
    queue = summary["queue"]
    assert queue["completed_more_than_once"] == 0 and queue["pending"] == 0
    assert summary["samples"] == epochs * Dataset(data).rows("train")
    assert 0.5 < summary["eval"]["auc"] <= 1.0
    if dynamic:
        assert rec["partial_checkpoints"] > 0 and summary["dynamic_tables"]["a"]["evicted"] > 0


@pytest.mark.parametrize("mode, shard", [("sync", 1)])  # async: tests/harness
def test_full_recovery_rolls_every_shard_and_the_data_back_and_completes(
        ray_cluster, data, tmp_path, mode, shard):
    """async: shard 0 holds the dense parameters too, they roll back with the rest; sync: the
    dense replicas roll back to the job checkpoint's."""
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 f"train.epochs={KILL_EPOCHS}", 'recovery.kind="full"',
                 "recovery.checkpoint_every_s=1.0",
                 f'faults.kills=[{{target="ps", index={shard}, at_step={KILL_STEP}}}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    rec = summary["recovery"]
    assert rec["kind"] == "full" and len(rec["recoveries"]) == 1
    recovery = rec["recoveries"][0]
    assert recovery["shard"] == shard and recovery["job_sequence"] >= 1
    assert rec["samples_redone"] > 0 and rec["pls"] == 0  # done again, none lost
    assert recovery["downtime_s"] > 0 and rec["overhead"]["total_s"] >= recovery["downtime_s"]
    assert recovery["downtime_to"] == "first pull served"  # after the rollback
    queue = summary["queue"]  # the data position rolled back: every chunk completed once
    assert queue["completed_more_than_once"] == 0 and queue["pending"] == 0
    chunks = len(Dataset(data).chunks("train", 16 * B))
    assert queue["completed"] == KILL_EPOCHS * chunks
    assert summary["samples"] == KILL_EPOCHS * Dataset(data).rows("train")  # the redone
    # ones once
    assert rec["final_job_checkpoint"] is not None
    assert 0.5 < summary["eval"]["auc"] <= 1.0


# -- resume (each run here is a subprocess with its own embedded Ray) --------------------------

RESUME_CONFIG = """mode = "sync"
[data]
path = "{data}"
[model]
embedding_dim = 4
bottom_mlp = [8]
top_mlp = [8]
[train]
batch_size = 64
epochs = 10
[cluster]
workers = 2
ps_shards = 2
[recovery]
kind = "full"
checkpoint_every_s = 1.0
[output]
progress = false
plot = false
"""


def _train_cli(*args) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": "local"}  # each its own Ray instance
    return subprocess.Popen([sys.executable, "-m", "recsync", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _final_parameters(out) -> dict[str, np.ndarray]:
    """The dense replica and every shard's rows, from the run's final checkpoints."""
    root = out / "checkpoints"
    final = files.latest(job.job_dir(root))
    assert final.meta["final"]
    params = {"dense": final.arrays["dense.params"]}
    for shard, sequence in enumerate(final.meta["shard_sequences"]):
        for name, a in files.chain(job.shard_dir(root, shard), sequence)[-1].arrays.items():
            params[f"shard{shard}.{name}"] = a
    return params


def test_resume_after_the_driver_is_killed_ends_with_the_uninterrupted_parameters(data,
                                                                                  tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(RESUME_CONFIG.format(data=data))
    whole = _train_cli("--config", str(cfg), "--out", str(tmp_path / "whole"))
    assert whole.wait(timeout=300) == 0, whole.stdout.read()

    out = tmp_path / "crashed"
    crashed = _train_cli("--config", str(cfg), "--out", str(out))
    deadline = time.monotonic() + 240
    while not (out / "checkpoints" / "job" / "ckpt-000004.json").exists():  # mid-run
        assert crashed.poll() is None and time.monotonic() < deadline, crashed.stdout.read()
        time.sleep(0.2)
    # The driver's machine dies: the driver and every process it started (Ray's, the actors').
    # (Killed alone, it leaves Ray's agents behind for a minute, holding Ray's default ports,
    # which slows the Ray instances that later tests start.)
    tree = psutil.Process(crashed.pid).children(recursive=True)
    crashed.send_signal(signal.SIGKILL)  # no summary is written
    crashed.wait()
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)
    assert not (out / "summary.json").exists()

    resumed = _train_cli("--resume", str(out))
    text = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, text
    assert "resumed from job checkpoint" in text
    a, b = _final_parameters(tmp_path / "whole"), _final_parameters(out)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)

    again = _train_cli("--resume", str(out))  # a completed run has nothing to resume
    text = again.communicate(timeout=120)[0]
    assert again.returncode != 0 and "the run completed" in text
