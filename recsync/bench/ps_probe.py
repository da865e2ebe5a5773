"""Scenario `ps`, the saturation curve's probe: where one PS shard's CPU goes per pull and per
push of this model's batches, as the EMULATED cluster charges it (PSShard.stats()["pacing"],
the shard's EmulatedMachine totals), and ShardCore's own part of it in process.
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

from recsync.bench import overhead as ov

IDLE_S = 2.0  # the probe's shard left idle this long, to measure its process's idle CPU


def shard_time(cfg, data: Path, calls: int) -> dict:
    """The shard's CPU per pull and per push (ms) for this model's batches: a fresh PSShard on
    ``cfg``'s emulated cores, called through PSClient as a worker calls it: ``calls`` pulls in a
    row (their rows new: initialised by these pulls), the same pulls again (warm, as in the
    arms), then their pushes, each waited for; the shard's EmulatedMachine totals (CPU charged
    and not charged yet) read between the blocks; then, after ``IDLE_S`` to settle, ``IDLE_S``
    of no calls, whose CPU (Ray's threads) the machine charges to the next request. Beside it, ShardCore's own work
    for the same calls in this process."""
    import ray
    import torch
    from torch.nn.utils import parameters_to_vector

    from recsync.cluster.ray_session import ray_session
    from recsync.data.reader import Dataset
    from recsync.distributed.driver_model import DriverModel
    from recsync.model import loss as model_loss
    from recsync.ps.build import make_core
    from recsync.ps.client import PSClient
    from recsync.ps.shard import PSShard
    torch.set_num_threads(cfg.train.threads)
    ds = Dataset(cfg.data.path)
    model = DriverModel(cfg, ds)
    build = functools.partial(make_core, model.tables, cfg, 0, model.initial_dense())
    chunk = ds.chunks("train", cfg.train.batch_size * (calls + 1))[0]
    first, *batches = list(ds.batches(chunk, cfg.train.batch_size))[:calls + 1]
    params = list(model.dense_model.parameters())
    with ov.embedded_ray(), ray_session(cfg.cluster):
        shard = PSShard.remote(build, cores=cfg.emulation.cores_per_shard)
        client = PSClient([shard], model.plan, dense_shard=0, push_window=1,
                          transport=cfg.cluster.transport)
        client.pull(first)  # waits for the shard to be built
        pacing = [ray.get(shard.stats.remote())["pacing"]]
        for b in batches:
            client.pull(b)
        pacing.append(ray.get(shard.stats.remote())["pacing"])
        pulled = [client.pull(b) for b in batches]
        pacing.append(ray.get(shard.stats.remote())["pacing"])
        for b, p in zip(batches, pulled):  # the gradients, as AsyncWorker.compute makes them
            for w in params:
                w.grad = None
            model_loss.loss(model.dense_model, b, p.embeddings()).backward()
            p.dense_grad = parameters_to_vector([w.grad for w in params]).numpy()
        pacing.append(ray.get(shard.stats.remote())["pacing"])  # the backward's CPU is ours
        for p in pulled:
            client.push(p, p.dense_grad)  # waits for the one before (push_window 1)
        client.flush()
        pacing.append(ray.get(shard.stats.remote())["pacing"])
        time.sleep(IDLE_S)  # the last push's objects released; then nothing to serve:
        pacing.append(ray.get(shard.stats.remote())["pacing"])
        time.sleep(IDLE_S)  # what the shard's process uses while it serves nothing
        pacing.append(ray.get(shard.stats.remote())["pacing"])
        client.close()
        ray.kill(shard)
    pushes = [([u.numpy() for u in p.ids], [g.numpy() for g in p.row_grads()], p.dense_grad)
              for p in pulled]
    core = core_time(build(), pushes)

    def cpu(a, b):  # the process's CPU between two reads: charged, and not charged yet
        return (pacing[b]["cpu_s"] + pacing[b]["unpaced_cpu_s"]
                - pacing[a]["cpu_s"] - pacing[a]["unpaced_cpu_s"])

    def per_call(a, b):
        return cpu(a, b) / calls * 1e3
    rows = [sum(len(u) for u in ids) for ids, _, _ in pushes]
    return {"calls": calls, "cold_pull_cpu_ms": per_call(0, 1), "pull_cpu_ms": per_call(1, 2),
            "push_cpu_ms": per_call(3, 4), "rows_per_call": statistics.median(rows),
            "dense_params": len(pushes[0][2]), "idle_cores": cpu(5, 6) / IDLE_S, **core}


def core_time(core, pushes: list) -> dict:
    """ShardCore's own CPU per call (ms, this process, medians): a pull of new rows, the same
    pull again, a push, its rows alone (no dense gradient) and the dense update alone."""
    def timed(fn) -> float:
        out = []
        for ids, grads, dense in pushes:
            begin = time.process_time()
            fn(ids, grads, dense)
            out.append(time.process_time() - begin)
        return statistics.median(out) * 1e3
    meta = {"version_read": 0, "lr_scale": 1.0, "sampled": None}
    return {"core_cold_pull_cpu_ms": timed(lambda i, g, d: core.pull(i)),
            "core_pull_cpu_ms": timed(lambda i, g, d: core.pull(i)),
            "core_push_cpu_ms": timed(lambda i, g, d: core.push(i, g, d, dict(meta))),
            "core_push_rows_cpu_ms": timed(lambda i, g, d: core.push(i, g, None, dict(meta))),
            "core_push_dense_cpu_ms": timed(lambda i, g, d: core.push(
                [x[:0] for x in i], [x[:0] for x in g], d, dict(meta)))}
