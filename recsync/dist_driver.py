"""A distributed run (modes sync and async): PS shards, a work queue and workers on Ray.

The driver builds everything, then watches: it polls worker status for metrics and progress,
injects configured faults, and stops the run with a clear error when a PS shard dies (there are
no checkpoints to restore it from yet). At the end it evaluates the trained model through the PS
and writes the same outputs as a local run.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import ray
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from tqdm import tqdm

from recsync.config import RunConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.embedding.row_optim import make_row_optimizer
from recsync.metrics import MetricsLog
from recsync.model.registry import build_model
from recsync.ps.client import PSClient
from recsync.ps.core import DenseState, ShardCore
from recsync.ps.shard import PSShard
from recsync.trainer import LocalModel, evaluate, table_rows_for
from recsync.worker.queue import WorkQueue
from recsync.worker.worker import Worker

POLL_S = 0.5


class RunFailed(RuntimeError):
    """The run cannot go on (e.g. a PS shard died without a checkpoint); says which and why."""


def _make_core(tables, cfg: RunConfig, shard: int, dense_init: np.ndarray | None) -> ShardCore:
    t = cfg.train
    dense = (DenseState(torch.from_numpy(dense_init), t.dense_optimizer, t.dense_lr)
             if dense_init is not None else None)
    return ShardCore(tables, make_row_optimizer(t.embedding_optimizer, t.embedding_lr),
                     shard=shard, num_shards=cfg.cluster.ps_shards,
                     num_workers=cfg.cluster.workers, seed=t.seed,
                     init_scale=cfg.model.embedding_init_scale, dense=dense)


def run_distributed(cfg: RunConfig, ds: Dataset, log: MetricsLog, progress) -> dict:
    """Train on Ray; returns what the summary needs beyond the local fields."""
    c, t = cfg.cluster, cfg.train
    torch.manual_seed(t.seed)
    dense_model, tables = build_model(cfg.model, ds.meta["num_dense"], ds.table_names,
                                      table_rows_for(cfg.model, ds.table_rows))
    dense_init = parameters_to_vector(dense_model.parameters()).detach().numpy()
    shards = [PSShard.remote(functools.partial(
        _make_core, tables, cfg, s, dense_init if (cfg.mode == "async" and s == 0) else None))
        for s in range(c.ps_shards)]
    chunks = ds.chunks("train", cfg.data.chunk_rows or 16 * t.batch_size)
    seed = t.seed if cfg.data.shuffle else None
    items = [(e, ch) for e in range(t.epochs) for ch in chunk_order(chunks, epoch=e,
                                                                   shuffle_seed=seed)]
    queue = WorkQueue.remote(items)
    workers = [Worker.remote(r, cfg, shards, queue) for r in range(c.workers)]
    if cfg.mode == "sync":
        host, port = ray.get(workers[0].address.remote())
        ray.get([w.join_group.remote(host, port, c.workers) for w in workers])
    start = time.time()
    progress.train_start = time.perf_counter()
    ray.get([w.start.remote(start) for w in workers])
    total = t.epochs * ds.rows("train")
    if t.max_steps:
        total = min(total, t.max_steps * t.batch_size * c.workers)
    statuses = _watch(cfg, workers, shards, log, progress, total, start)
    progress.train_end = time.perf_counter()
    shard_stats = ray.get([s.stats.remote() for s in shards])
    if cfg.mode == "sync":
        final_dense = ray.get(workers[0].dense_vector.remote())
    else:
        final_dense = ray.get(shards[0].pull.remote([np.empty(0, np.int64)] * len(tables)))[1]
    with torch.no_grad():
        vector_to_parameters(torch.tensor(final_dense), list(dense_model.parameters()))
    model = LocalModel(dense_model, PSClient(shards, [tb.dim for tb in tables]), None)
    final_eval = evaluate(model, ds, ds.rows("eval"), t.eval_batch_size)
    return {"eval": final_eval, "statuses": statuses, "shards": shard_stats,
            "queue": ray.get(queue.summary.remote()),
            "taken": ray.get([w.taken_chunks.remote() for w in workers]),
            "model": model}  # its lookup serves the trained rows while the Ray session lasts


def _watch(cfg, workers, shards, log, progress, total, start) -> list[dict]:
    """Poll until every worker is done; write metrics; raise RunFailed on a fatal fault."""
    bar = tqdm(total=total, unit="sample", unit_scale=True, desc=f"train ({cfg.mode})",
               disable=None if cfg.output.progress else True, smoothing=0.1)
    last = time.perf_counter()
    kills = sorted(cfg.faults.kills, key=lambda k: k.at_s)
    try:
        while True:
            time.sleep(POLL_S)
            elapsed = time.time() - start
            while kills and kills[0].at_s <= elapsed:
                k = kills.pop(0)
                target = workers[k.index] if k.target == "worker" else shards[k.index]
                target.die.remote()
                progress.events.append({"time_s": elapsed, "event": f"killed {k.target} "
                                        f"{k.index} (injected fault)"})
            statuses = _statuses(workers, shards)
            now = time.perf_counter()
            samples = sum(s["samples"] for s in statuses)
            bar.update(samples - progress.samples)
            interval_samples = samples - progress.samples
            progress.samples, progress.steps = samples, max(s["steps"] for s in statuses)
            loss_n = sum(s["loss_samples"] for s in statuses)
            record = {
                "time_s": progress.elapsed(), "samples": samples, "step": progress.steps,
                "loss": sum(s["loss_sum"] for s in statuses) / loss_n if loss_n else None,
                "samples_per_s": interval_samples / (now - last), "mode": cfg.mode,
                "worker_step_s": [s["step_s"] / s["interval_steps"] if s["interval_steps"]
                                  else None for s in statuses],
                "staleness": None, "events": progress.events[progress.logged_events:],
                "eval": None}
            progress.logged_events = len(progress.events)
            last = now
            log.write(record)
            if record["loss"] is not None:
                bar.set_postfix(loss=f"{record['loss']:.4f}")
            errors = [s for s in statuses if s["state"] == "error"]
            if errors:
                raise RunFailed(f"worker {errors[0]['rank']} failed: {errors[0]['error']}")
            if all(s["state"] == "done" for s in statuses):
                return statuses
    finally:
        bar.close()


def _statuses(workers, shards) -> list[dict]:
    try:
        statuses = ray.get([w.status.remote() for w in workers], timeout=30)
    except ray.exceptions.RayActorError as e:
        raise RunFailed(f"a worker process died ({e.__class__.__name__}); worker restart "
                        f"is not supported yet") from None
    for s in statuses:
        if s["state"] == "error" and "ActorDiedError" in (s["error"] or "") \
                or "RayActorError" in (s["error"] or ""):
            dead = _dead_shards(shards)
            if dead:
                raise RunFailed(
                    f"parameter-server shard {dead[0]} died and there is no checkpoint to "
                    f"restore it from; the run stops here. (Partial recovery from shard "
                    f"checkpoints is planned; until then re-run the job.)")
    return statuses


def _dead_shards(shards) -> list[int]:
    dead = []
    for i, s in enumerate(shards):
        try:
            ray.get(s.stats.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            dead.append(i)
    return dead
