"""Does gba trail sync at one global batch without a straggler because of staleness? A replay
without Ray (docs/sync_modes.md, "gba against sync without a straggler").

4 workers x 1024 and 2 PS shards: real ShardCores with GBA's GlobalBatch rule, real PSClients,
GBAWorker's compute, the run's data order (a queue of seeded chunks of 4096 rows, a worker
takes the next chunk when it has read its own). The arms differ only in *when each worker
reads the parameters it computes on*:

- ``sync``: the workers step in lock-step and every worker of a round reads the parameters
  after the previous round's update: sync's computation on the global batch.
- ``gba``: each worker's step takes 1 + jitter x N(0, 1) time units (seeded); at the end of a
  step it computes on what it pulled, pushes, and pulls its next batch at once, as a gba worker
  does, so most gradients are computed one update back (staleness as in real runs).
- ``fresh``: gba's order of pushes and grouping into updates, every gradient computed on the
  parameters as they are when it is pushed (no staleness).
- ``stale_dense`` / ``stale_rows``: only the dense vector / only the rows read as gba reads
  them, the other fresh.

Run (data generated on first use, SynthSpec() as scenario `stragglers`):
  PYTHONPATH=. .venv/bin/python scripts/gba_staleness_sim.py --data /tmp/d --rows 1500000 \
      --eval-rows 200000 --seeds 0 1 2 --arms sync gba --jitter 0.2
Prints, per seed and arm, eval AUC and log loss, and the staleness of the applied gradients.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import recsync.ps.client as client_mod
from recsync.config import ModelConfig, RunConfig, TrainConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.data.synthetic import SynthSpec, generate
from recsync.embedding.row_optim import make_row_optimizer
from recsync.metrics.evaluate import evaluate
from recsync.model.setup import model_for
from recsync.modes.base import WorkerContext
from recsync.modes.gba import GBAWorker, GlobalBatch
from recsync.ps.aggregation import StalenessDecay
from recsync.ps.client import PSClient
from recsync.ps.core import DenseState, ShardCore

ARMS = ("sync", "gba", "fresh", "stale_dense", "stale_rows")


def fake_shards(cores):
    """ShardCores behind objects shaped like Ray actor handles (calls run at once)."""
    from types import SimpleNamespace
    return [SimpleNamespace(
        pull=SimpleNamespace(remote=lambda ids, min_version=0, c=c: c.pull(ids)),
        push=SimpleNamespace(remote=lambda *a, c=c: c.push(*a))) for c in cores]


def build(ds, model_cfg, train_cfg, workers, shards):
    torch.manual_seed(train_cfg.seed)
    built = model_for(model_cfg, ds)
    init = parameters_to_vector(built.module.parameters()).detach().clone()
    rows = make_row_optimizer(train_cfg.embedding_optimizer, train_cfg.embedding_lr,
                              weight_decay=train_cfg.embedding_weight_decay)
    cores = [ShardCore(built.tables, rows, shard=s, num_shards=shards,
                       rule=GlobalBatch(workers, StalenessDecay(4, "inverse")), mode="gba",
                       seed=train_cfg.seed, init_scale=model_cfg.embedding_init_scale,
                       dense=DenseState(init, train_cfg.dense_optimizer, train_cfg.dense_lr,
                                        train_cfg.dense_weight_decay)
                       if s == 0 else None)
             for s in range(shards)]
    handles = fake_shards(cores)
    halves = []
    for w in range(workers):
        client = PSClient(handles, built.plan, dense_shard=0, push_window=1)
        module = model_for(model_cfg, ds).module
        halves.append(GBAWorker(WorkerContext(rank=w, cfg=RunConfig(), model=module,
                                              client=client, new_client=lambda: client,
                                              shards=handles)))
    return built, cores, halves


class Feed:
    """Batches as the distributed run hands them out: a queue of chunks in the run's seeded
    order; a worker takes the next chunk when it has read its own."""

    def __init__(self, ds, batch, chunk_rows, seed, workers):
        self.ds, self.batch, self.seed = ds, batch, seed
        self.queue = iter(chunk_order(ds.chunks("train", chunk_rows), epoch=0,
                                      shuffle_seed=seed))
        self.current = [iter(()) for _ in range(workers)]

    def next(self, w):
        while True:
            b = next(self.current[w], None)
            if b is not None:
                return b
            chunk = next(self.queue, None)
            if chunk is None:
                return None
            self.current[w] = self.ds.batches(chunk, self.batch, shuffle_seed=self.seed)


def read(arm, client, batch, early):
    """The parameters a worker computes ``batch`` on: read when it pulled (``early``) or now."""
    if arm in ("gba", "sync"):
        return early
    now = client.pull(batch)  # what a worker reading the parameters now would see
    if arm == "stale_dense":
        now.dense, now.versions = early.dense, early.versions
        return now
    if arm == "stale_rows":
        early.dense = now.dense
        return early
    now.versions = early.versions  # fresh: no staleness, the same grouping as gba
    return now


def train(arm, ds, model_cfg, train_cfg, workers, shards, batch, chunk_rows, jitter):
    """``sync``: rounds in lock-step. Otherwise events: each worker's step takes 1 + jitter x
    N(0, 1) time units (seeded); at its step's end it computes on what it pulled, pushes and
    pulls its next batch at once, as a gba worker does."""
    built, cores, halves = build(ds, model_cfg, train_cfg, workers, shards)
    feed = Feed(ds, batch, chunk_rows, train_cfg.seed, workers)
    rng = np.random.default_rng([train_cfg.seed, 17])
    if arm == "sync":
        while True:
            parts = [(h, feed.next(w)) for w, h in enumerate(halves)]
            parts = [(h, b) for h, b in parts if b is not None]
            if not parts:
                break
            pulled = [h.ctx.client.pull(b) for h, b in parts]
            for (h, b), p in zip(parts, pulled):
                _, dense_grad = h.compute(b, p)
                h.send(p, dense_grad, len(b))
    else:
        held = {}
        for w, h in enumerate(halves):
            b = feed.next(w)
            held[w] = (b, h.ctx.client.pull(b))
        clock = [max(0.1, 1 + jitter * rng.standard_normal()) for _ in range(workers)]
        while held:
            w = min(held, key=lambda k: (clock[k], k))
            h, (b, early) = halves[w], held.pop(w)
            pulled = read(arm, h.ctx.client, b, early)
            _, dense_grad = h.compute(b, pulled)
            h.send(pulled, dense_grad, len(b))
            nxt = feed.next(w)
            if nxt is not None:
                held[w] = (nxt, h.ctx.client.pull(nxt))
                clock[w] += max(0.1, 1 + jitter * rng.standard_normal())
    for c in cores:
        c.rule.end(c)
    return built, cores, halves


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/tmp/gba_sim_data")
    ap.add_argument("--rows", type=int, default=600_000)
    ap.add_argument("--eval-rows", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS))
    ap.add_argument("--jitter", type=float, default=0.0)
    args = ap.parse_args()
    client_mod.ray.get = lambda refs: refs
    torch.set_num_threads(1)
    root = Path(args.data)
    if not (root / "meta.json").exists():
        generate(root, rows=args.rows, eval_rows=args.eval_rows, spec=SynthSpec(),
                 processes=1, progress=False)
    ds = Dataset(root)
    model_cfg = ModelConfig(bottom_mlp=[64, 32], top_mlp=[64, 32])
    for seed in args.seeds:
        for arm in args.arms:
            begin = time.perf_counter()
            train_cfg = TrainConfig(seed=seed)
            built, cores, halves = train(arm, ds, model_cfg, train_cfg, 4, 2, 1024, 4096,
                                         args.jitter)
            vector_to_parameters(torch.from_numpy(cores[0].dense.params.detach().numpy()),
                                 built.module.parameters())
            ev = evaluate(built.module, halves[0].ctx.client, ds, args.eval_rows, 4096)
            st = cores[0].staleness
            mean = sum(k * n for k, n in st.items()) / max(1, sum(st.values()))
            mx = max(st) if st else 0
            print(f"seed {seed} {arm:12s} auc {ev['auc']:.4f} logloss {ev['logloss']:.4f} "
                  f"staleness mean {mean:.2f} max {mx} updates {cores[0].version} "
                  f"({time.perf_counter() - begin:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
