"""On the runtime harness (every actor real, on threads; Ray's transport faked): sync and
hybrid equal local training on the global batch, every PS mode completes every chunk once, a
killed worker is replaced in every mode, switching loses nothing, shadow replicas converge, a
dead PS shard stops the run with a clear error, checkpoint rounds, full and partial recovery.
(The same on Ray, once per mode family and fault kind, and `recsync train --resume` after the
driver is killed: tests/integration/test_runtime.py.)

Run: pytest -q tests/harness
"""

import json
import time

import numpy as np
import pytest
import ray
import torch
from torch.nn.utils import parameters_to_vector

from recsync.data.reader import Batch, Dataset
from recsync.distributed.errors import RunFailed
from recsync.distributed.train import run_distributed
from recsync.metrics.core import MetricsLog
from recsync.run.driver import run
from recsync.run.local_run import build_local_model, train_step
from harness_config import B, config


def test_sync_two_workers_equal_local_with_the_global_batch(fake_ray, data, tmp_path):
    _equals_local_with_the_global_batch(data, tmp_path, 'mode="sync"')


def test_hybrid_without_staleness_equals_sync_and_local_with_the_global_batch(fake_ray, data,
                                                                             tmp_path):
    _equals_local_with_the_global_batch(data, tmp_path, 'mode="hybrid"', "hybrid.max_staleness=0")


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


@pytest.mark.parametrize("mode", ["async", "gba", "shadow", "foreground", "eager",
                                  "hybrid"])
def test_ps_modes_complete_every_chunk_exactly_once(fake_ray, data, tmp_path, mode):
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


def test_a_dead_ps_shard_stops_the_run_with_a_clear_error(fake_ray, data, tmp_path):
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=50", 'faults.kills=[{target="ps", index=1, at_s=1.0}]')
    with pytest.raises(RunFailed, match="shard 1 died"):
        run(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "shard 1" in summary["error"]
    # it stopped because of the kill, long before the end, and without hanging after it (a
    # hang guard counted from the kill: Ray's start-up is not what this test is about)
    assert summary["samples"] < 50 * Dataset(data).rows("train") / 2
    [kill] = summary["failures"]
    assert kill["event"] == "killed ps 1" and summary["train_s"] - kill["time_s"] < 30


@pytest.mark.parametrize("mode", ["async", "sync", "gba", "shadow", "eager", "hybrid"])
def test_a_killed_worker_is_replaced_and_every_chunk_completes_once(fake_ray, data, tmp_path,
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


def test_switching_sync_gba_sync_loses_nothing_and_applies_nothing_twice(fake_ray, data,
                                                                        tmp_path):
    """Switches while gba pushes are in flight: every sample's gradient reaches every shard's
    updates exactly once (no decay, so none is dropped), and every chunk completes once."""
    cfg = config(data, 'mode="sync"', "cluster.workers=2", "cluster.ps_shards=2",
                 f"data.chunk_rows={2 * B}", "train.epochs=8", 'gba.decay="none"',
                 'switching.schedule=[{to="gba", at_step=20}, {to="sync", at_step=120}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    assert [m["mode"] for m in summary["modes"]] == ["sync", "gba", "sync"]
    assert all(m["cause"].startswith("schedule") for m in summary["modes"][1:])
    assert summary["mode"] == "sync"
    ds = Dataset(data)
    assert summary["samples"] == 8 * ds.rows("train")
    assert summary["queue"]["completed"] == 8 * len(ds.chunks("train", 2 * B))
    assert summary["queue"]["completed_more_than_once"] == 0
    for shard in summary["per_shard"]:
        assert shard["samples_applied"] == summary["samples"]
    assert summary["gba"]["applied"] > 0 and summary["gba"]["dropped"] == 0
    events = [json.loads(line)["events"] for line in (tmp_path / "metrics.jsonl").open()]
    switched = [e["event"] for ev in events for e in ev if e["event"].startswith("switched")]
    assert switched == ["switched sync -> gba", "switched gba -> sync"]
    assert 0.5 < summary["eval"]["auc"] <= 1.0


@pytest.mark.parametrize("algorithm", ["ma", "easgd", "bmuf"])
def test_shadow_replicas_that_start_apart_converge_while_training(fake_ray, data, tmp_path,
                                                                   algorithm):
    """Two trainers start from different dense parameters; with the shadow thread running,
    their distance falls below 2% of where it started while both are still training."""
    from recsync.distributed.train import build_run
    from recsync.worker.worker import Worker
    cfg = config(data, 'mode="shadow"', f'shadow.algorithm="{algorithm}"', "cluster.workers=2",
                 "cluster.ps_shards=2", "train.epochs=200", "train.dense_lr=0.001",
                 "shadow.min_interval_s=0.01")
    run_ = build_run(cfg, Dataset(data))
    actors = run_.actors
    start = parameters_to_vector(run_.model.dense_model.parameters()).detach().numpy()
    apart = [start, start + np.random.default_rng(0).normal(0, 0.5, len(start)).astype(np.float32)]
    workers = [Worker.remote(r, cfg, actors.shards, actors.queue, {"params": apart[r]})
               for r in range(2)]
    try:
        host, port = ray.get(workers[0].address.remote())
        ray.get([w.join_group.remote(host, port, 2) for w in workers])
        ray.get([w.start.remote(time.time()) for w in workers])
        initial = np.linalg.norm(apart[0] - apart[1])
        deadline = time.time() + 60
        while True:
            a, b = [d["params"] for d in ray.get([w.dense_state.remote() for w in workers])]
            states = [s["state"] for s in ray.get([w.status.remote() for w in workers])]
            assert states == ["running", "running"], states
            if np.linalg.norm(a - b) < 0.02 * initial:
                break
            assert time.time() < deadline, f"distance {np.linalg.norm(a - b)} of {initial}"
            time.sleep(0.2)
        assert min(ray.get(w.mode_stats.remote())["rounds"] for w in workers) > 0
    finally:
        for w in workers:
            ray.kill(w)
        for s in actors.shards:
            ray.kill(s)
        ray.kill(actors.queue)


def test_periodic_shard_checkpoints_are_written_complete_and_restore(fake_ray, data,
                                                                     tmp_path):
    from recsync.checkpoint import files
    from recsync.distributed.checkpoints import JOB_KEEP_EXTRA
    from recsync.model.setup import model_for
    from recsync.ps.build import make_core
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=6", "recovery.checkpoint_every_s=1.0", "recovery.keep=2")
    summary = run(cfg, tmp_path)
    rec = summary["recovery"]
    assert summary["status"] == "completed" and rec["checkpoints"] >= 2
    # the rounds while training (the first before it), and the final one (the trained model)
    assert rec["written_per_shard"] == [rec["checkpoints"] + 1] * 2
    assert 0 < rec["checkpoint_overhead_frac"] < 0.5
    kept_jobs = files.manifests(tmp_path / "checkpoints" / "job")
    assert len(kept_jobs) == 2 + JOB_KEEP_EXTRA  # keep + the two a dead shard may have lost
    ds = Dataset(data)
    tables = model_for(cfg.model, ds).tables
    for s in range(2):
        directory = tmp_path / "checkpoints" / f"shard-{s}"
        # older ones deleted, except those the kept job checkpoints name
        named = {json.loads(p.read_text())["meta"]["shard_sequences"][s] for p in kept_jobs}
        assert {int(p.stem.split("-")[1]) for p in files.manifests(directory)} == named
        ckpt = files.latest(directory)
        assert ckpt.sequence == rec["checkpoints"] + 1 and ckpt.skipped == []
        core = make_core(tables, cfg, s, np.zeros(ckpt.arrays["dense.params"].shape,
                                                  np.float32) if s == 0 else None)
        core.restore(ckpt.arrays, ckpt.meta)
        assert 0 < core.version <= summary["per_shard"][s]["version"]
        assert core.store.num_initialized() > 0
    events = [e["event"] for line in (tmp_path / "metrics.jsonl").open()
              for e in json.loads(line)["events"]]
    assert sum(e.startswith("checkpoint: ") for e in events) == rec["checkpoints"]


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


@pytest.mark.parametrize("mode, shard, standbys", [("async", 1, 1), ("shadow", 0, 0)])
def test_partial_recovery_restarts_a_killed_shard_from_its_checkpoint_and_goes_on(
        fake_ray, data, tmp_path, mode, shard, standbys):
    """(shadow: EASGD, whose center copy is on the shard killed; without a standby: Ray
    restarts the shard's process)"""
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=2",
                 'shadow.algorithm="easgd"',
                 f"train.epochs={KILL_EPOCHS}", 'recovery.kind="partial"',
                 "recovery.checkpoint_every_s=1.0", f"recovery.standby_shards={standbys}",
                 f'faults.kills=[{{target="ps", index={shard}, at_step={KILL_STEP}}}]')
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
    assert summary["samples"] == KILL_EPOCHS * Dataset(data).rows("train")
    assert 0.5 < summary["eval"]["auc"] <= 1.0


def test_the_checkpoint_interval_is_chosen_from_the_measured_save_cost_and_mtbf(
        fake_ray, data, tmp_path):
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=3", 'recovery.kind="partial"', "recovery.mtbf_s=100",
                 "recovery.pls_target=0.01")
    summary = run(cfg, tmp_path)
    decision = summary["recovery"]["interval_decision"]
    assert decision["inputs"]["mtbf_s"] == 100 and decision["inputs"]["shards"] == 2
    assert decision["inputs"]["save_cost_s"] > 0
    assert decision["partial_interval_s"] == pytest.approx(2 * 100 * 2 * 0.01)  # 4 s
    assert decision["kind"] in ("partial", "full") and decision["used_interval_s"] == 4.0
    events = [e["event"] for line in (tmp_path / "metrics.jsonl").open()
              for e in json.loads(line)["events"]]
    assert any(e.startswith("checkpoint interval: save cost") for e in events)
    assert summary["recovery"]["checkpoints"] >= 1


@pytest.mark.parametrize("mode, shard", [("async", 0), ("sync", 1)])
def test_full_recovery_rolls_every_shard_and_the_data_back_and_completes(
        fake_ray, data, tmp_path, mode, shard):
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


def test_partial_recovery_from_mfu_checkpoints_restores_a_chain(fake_ray, data, tmp_path):
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=10", 'recovery.kind="partial"', 'recovery.rows="mfu"',
                 "recovery.mfu_fraction=0.2", "recovery.full_every=4",
                 "recovery.checkpoint_every_s=1.0",  # full at 0 s, partial at 1 and 2 s
                 # (a kill at a time: the chain it restores is of rounds taken by time)
                 'faults.kills=[{target="ps", index=1, at_s=3.0}]')
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    rec = summary["recovery"]
    assert rec["rows"] == "mfu" and rec["partial_checkpoints"] > 0
    [recovery] = rec["recoveries"]
    assert recovery["shard"] == 1 and recovery["sequence"] >= 1 and recovery["chain"] >= 1
    assert 0 < rec["pls"] < 0.5
    assert summary["queue"]["completed_more_than_once"] == 0
    assert 0.5 < summary["eval"]["auc"] <= 1.0
