"""A distributed run from start to end: build its parts (handle.py), start (or resume from a
job checkpoint), watch until the workers are done and the end is made (distributed/ending.py)."""

from __future__ import annotations

import time
from pathlib import Path

from recsync.checkpoint import files
from recsync.cluster import storage
from recsync.cluster.placement import actor_nodes, node_alive, placement_line
from recsync.config import RunConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.distributed.actions import carry_out
from recsync.distributed.actors import RunActors
from recsync.distributed.best import BestKept
from recsync.distributed.checkpoints import CheckpointRounds
from recsync.distributed.driver_model import DriverModel
from recsync.distributed.elastic import ElasticWorkers
from recsync.distributed.ending import finish
from recsync.distributed.handle import DistributedRun
from recsync.distributed.policy import Kind, decide
from recsync.distributed.shard_watch import ShardWatch
from recsync.distributed.tallies import RunTallies
from recsync.distributed.watch import watch
from recsync.metrics.core import MetricsLog
from recsync.modes import MODES
from recsync.run import warm_start
from recsync.run.local_run import CHUNK_BATCHES
from recsync.run.record import RunRecord


def checkpoint_dir(cfg: RunConfig, root: Path | None) -> Path | None:
    """Where the shards' checkpoints go if ``recovery`` asks for them: ``recovery.dir``, else
    ``root``."""
    if not (cfg.recovery.checkpoint_every_s or cfg.recovery.mtbf_s):
        return None
    root = storage.local(cfg.recovery.dir) if cfg.recovery.dir else root
    if root is None:
        raise ValueError("recovery.checkpoint_every_s is set but there is no directory "
                         "for checkpoints: set recovery.dir")
    return root.resolve()


def work_items(cfg: RunConfig, ds: Dataset) -> list[tuple]:
    """(epoch, chunk) of every chunk the run trains, in order."""
    t = cfg.train
    chunks = ds.chunks("train", cfg.data.chunk_rows or CHUNK_BATCHES * t.batch_size)
    seed = t.seed if cfg.data.shuffle else None
    return [(e, ch) for e in range(t.epochs)
            for ch in chunk_order(chunks, epoch=e, shuffle_seed=seed)]


def build_run(cfg: RunConfig, ds: Dataset, checkpoint_root: Path | None = None,
              started: float | None = None, warm=None, on_eval=None,
              run_dir: Path | None = None) -> DistributedRun:
    """A run's parts, its actors started. ``checkpoint_root``: where the shards' checkpoints
    go if ``recovery`` asks for them (``recovery.dir`` wins); ``started``: when the run began
    (perf_counter; default now); ``warm``: the model directory the run starts from
    (run/warm_start.py), if any; ``on_eval``: run()'s hook, told of each validation
    evaluation (run/selection.py); ``run_dir``: the output directory, where an elastic run
    reads `recsync scale`'s requests."""
    record = RunRecord() if started is None else RunRecord(start=started)
    ds.hold_out(cfg.train.validation)  # "train" stops before the validation slice
    model = DriverModel(cfg, ds, warm)
    actors = RunActors(cfg, work_items(cfg, ds), model.tables, model.initial_dense(),
                       checkpoint_dir(cfg, checkpoint_root))
    tallies, shard_watch = RunTallies(cfg.cluster.workers), ShardWatch()
    rounds = CheckpointRounds(cfg, record, actors, tallies, shard_watch, model)
    run = DistributedRun(cfg, ds, record, model, actors, tallies, shard_watch, rounds)
    run.best = BestKept(run, on_eval)
    if cfg.cluster.elastic:
        run.elastic = ElasticWorkers(cfg, MODES[cfg.mode], run_dir)
    return run


def run_distributed(cfg: RunConfig, ds: Dataset, log: MetricsLog, out_dir: Path | None = None,
                    resume: files.Checkpoint | None = None, *,
                    started: float | None = None, warm=None, on_eval=None) -> dict:
    """Train on Ray; returns what the summary needs beyond the local fields, with the run's
    record (on Ctrl-C or RunFailed the exception carries it). Checkpoints, if any, go to
    ``recovery.dir`` or ``out_dir``/checkpoints. ``resume``: a job checkpoint of an earlier
    run of this config to go on from; ``started``: when the run began (perf_counter);
    ``warm``: a model directory to start from (train.init_from, run/warm_start.py);
    ``on_eval``: run()'s hook, told of each validation evaluation."""
    run = build_run(cfg, ds, None if out_dir is None else Path(out_dir) / "checkpoints",
                    started, warm=None if resume else warm, on_eval=on_eval,
                    run_dir=None if out_dir is None else Path(out_dir))
    record = run.record
    try:
        # provisional: the clock starts again when the first workers start training
        record.train_s_before = resume.meta["train_s"] if resume else 0.0
        run.tallies.provisional_start(record.train_s_before, time.time())
        record.modes = [{"mode": cfg.mode, "from_s": 0.0, "to_s": None, "cause": "config"}]
        run.shard_statuses()  # every shard is up (and its first process known, to tell a
        # restart by), so that start-up is not counted as training
        start = decide(run.facts, cfg, [], [], resuming=resume is not None)
        if start.kind is Kind.ROLL_BACK:
            carry_out(run, start, [], 0.0, resume=resume)
        else:
            if run.model.warm is not None:  # train.init_from
                warm_start.install(run.actors, run.model)
            if run.actors.checkpoint_dir is not None:  # round 0: a rollback or resume
                # before the first
                run.rounds.log(run.rounds.take(), 0.0, training=False)
            dense = run.model.start_dense(cfg, run.facts.dense_on_ps)
            if run.elastic is not None:  # as many as Ray places, at least the minimum
                run.elastic.start(run, dense)
            else:
                run.start_workers(list(range(cfg.cluster.workers)), dense)
        record.placement = actor_nodes(run.actors)
        record.event(0.0, placement_line(record.placement))
        if record.placement["strategy"] != "none" or len(record.placement["nodes"]) > 1:
            print(placement_line(record.placement), flush=True)
        try:
            statuses, ended = watch(run, log, finish)
        finally:  # also on Ctrl-C or a failure
            if run.elastic is not None:
                record.elastic = run.elastic.section()
        record.stop()
        record.stopped = run.best.selection.section(run.best.reason())
        for rec in record.recoveries:  # the cluster may have marked a node dead since
            if rec.get("node_before"):
                rec["node_before_alive"] = node_alive(rec["node_before"]["node_id"])
        return {**ended, "statuses": [s.as_dict() for s in statuses], "record": record}
    except BaseException as e:  # Ctrl-C, RunFailed, an actor's error: the summary needs it
        record.stop()
        e.record = record
        # nothing of a failed run trains on in a Ray session that outlives it (a test's, a
        # user's notebook): its actors would live as long as the traceback holds their handles
        try:
            run.actors.stop_all()
        except Exception:  # noqa: BLE001 - the run's own error is the one to report
            pass
        raise
