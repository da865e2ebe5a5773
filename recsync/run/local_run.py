"""The local run (mode "local"): one process, the baseline every distributed mode is held to.

The step is the algorithm every mode distributes: pull the batch's rows, forward, loss,
backward, dense optimizer step, push the row gradients. Reading it top to bottom is reading the
algorithm. At the end: the local run itself (``run_local``: train, evaluate, record).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from recsync.config import ModelConfig, RunConfig, TrainConfig
from recsync.data.holdout import VALIDATION
from recsync.data.reader import Batch, Dataset, chunk_order
from recsync.embedding.lookup import LocalLookup
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.store import EmbeddingStore
from recsync.metrics.core import MetricsLog
from recsync.metrics.evaluate import evaluate
from recsync.metrics.progress import progress
from recsync.model import loss as model_loss
from recsync.model.compute import prepare, warm_up
from recsync.model.optim import dense_step, make_dense_optimizer
from recsync.model.setup import model_for
from recsync.run.record import RunRecord
from recsync.run.selection import (EARLY_STOPPING, EPOCHS, MAX_STEPS, BestLocal, Selection,
                                   say)
from recsync.run.signals import check_loss


@dataclass
class LocalModel:
    """A model with its rows served from this process."""

    dense: torch.nn.Module
    lookup: LocalLookup
    dense_optimizer: torch.optim.Optimizer
    warmup_steps: int = 0  # train.dense_warmup_steps


def build_local_model(model_cfg: ModelConfig, train_cfg: TrainConfig, ds: Dataset) -> LocalModel:
    torch.manual_seed(train_cfg.seed)
    built = model_for(model_cfg, ds)
    row_optimizer = make_row_optimizer(train_cfg.embedding_optimizer, train_cfg.embedding_lr,
                                       weight_decay=train_cfg.embedding_weight_decay)
    store = EmbeddingStore(built.tables, row_optimizer, seed=train_cfg.seed,
                           init_scale=model_cfg.embedding_init_scale)
    optimizer = make_dense_optimizer(train_cfg.dense_optimizer, built.module.parameters(),
                                     train_cfg.dense_lr, train_cfg.dense_weight_decay)
    prepare(built.module, train_cfg.dense_precision, train_cfg.compile)
    return LocalModel(built.module, LocalLookup(store, built.plan), optimizer,
                      train_cfg.dense_warmup_steps)


def train_step(m: LocalModel, batch: Batch) -> float:
    """One step on one batch; returns the batch's mean loss."""
    pulled = m.lookup.pull(batch)
    loss = model_loss.loss(m.dense, batch, pulled.embeddings())
    m.dense_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    dense_step(m.dense_optimizer, m.warmup_steps)
    m.lookup.push(pulled)
    return loss.item()


class StepTimer:
    """Wall time per step over a logging interval."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.start, self.steps, self.samples, self.loss_sum = time.perf_counter(), 0, 0, 0.0

    def add(self, samples: int, loss: float):
        self.steps += 1
        self.samples += samples
        self.loss_sum += loss * samples


# -- the local run: train, evaluate, record ------------------------------------------------------

CHUNK_BATCHES = 16  # default chunk: this many batches


def run_local(cfg: RunConfig, ds: Dataset, log: MetricsLog, started: float,
              warm=None, on_eval=None) -> dict:
    """Train as ``cfg`` says in this process; returns the final evaluation and the run's record
    (``started``: when the run began; ``warm``: the model directory to start from,
    run/warm_start.py; ``on_eval``: run()'s hook, told of each validation evaluation). An
    exception (Ctrl-C, a failure) carries ``record`` and ``model`` (the work done so far, to
    evaluate)."""
    record = RunRecord(start=started)
    ds.hold_out(cfg.train.validation)
    model = build_local_model(cfg.model, cfg.train, ds)
    if warm is not None:
        from recsync.run.warm_start import apply_local
        apply_local(model, warm, cfg)
    warm_up(model.dense, model.lookup.plan, ds, cfg.train.batch_size)  # compiles, if set
    record.train_start = time.perf_counter()
    try:
        selection, best = (Selection(cfg.train.patience, bool(ds.held), on_eval),
                           BestLocal())
        try:
            reason = _train(cfg, ds, model, log, record, selection, best)
        finally:
            record.stop()
        record.stopped = selection.section(reason)
        if best.restore(model):  # OUT/model and the final evaluation: the best model's
            say(selection.kept_line())
        return {"eval": final_eval(cfg, ds, model), "record": record, "model": model,
                "dynamic": model.lookup.store.dynamic_stats()}
    except BaseException as e:  # Ctrl-C, a diverging loss, bad data: the summary needs them
        e.record, e.model = record, model
        raise


def final_eval(cfg: RunConfig, ds: Dataset, model: LocalModel) -> dict:
    """The trained model on the whole eval split (with its scores if the run saves them)."""
    return evaluate(model.dense, model.lookup, ds, ds.rows("eval"), cfg.train.eval_batch_size,
                    keep_scores=cfg.output.save_predictions)


def _train(cfg: RunConfig, ds: Dataset, model: LocalModel, log: MetricsLog,
           record: RunRecord, selection: Selection, best: BestLocal) -> str:
    """Train until the end of the last epoch, ``train.max_steps`` or early stopping; returns
    which (run/selection.py). With a validation slice, training that its last periodic
    evaluation did not see is evaluated at the end, so the best model is chosen among them
    all."""
    t = cfg.train
    timer = StepTimer()
    total = t.epochs * ds.rows("train")
    if t.max_steps:
        total = min(total, t.max_steps * t.batch_size)
    bar = progress(total, "sample", f"train ({cfg.mode})", cfg.output.progress, smoothing=0.1)
    try:
        reason = _steps(cfg, ds, model, log, record, selection, best, timer, bar, total)
        if (selection.enabled and reason != EARLY_STOPPING
                and record.samples > (record.evals[-1]["samples"] if record.evals else 0)):
            line = _interval_record(cfg, record, timer)
            if not timer.steps:  # the last steps' record is written: this one is the eval's
                line.update(loss=None, samples_per_s=None, worker_step_s=[None])
            line["eval"] = _select(cfg, ds, model, record, selection, best)
            log.write(line)
            timer.reset()
        return reason
    finally:
        if timer.steps:  # the steps since the last record (also on Ctrl-C)
            log.write(_interval_record(cfg, record, timer))
        bar.close()


def _steps(cfg: RunConfig, ds: Dataset, model: LocalModel, log: MetricsLog, record: RunRecord,
           selection: Selection, best: BestLocal, timer: StepTimer, bar, total: int) -> str:
    """The training loop: each step, its metrics record, the periodic evaluations."""
    t = cfg.train
    chunks = ds.chunks("train", cfg.data.chunk_rows or CHUNK_BATCHES * t.batch_size)
    eval_every = record.eval_every = eval_interval(t, total)
    next_eval = eval_every
    shuffle_seed = t.seed if cfg.data.shuffle else None
    for epoch in range(t.epochs):
        for chunk in chunk_order(chunks, epoch=epoch, shuffle_seed=shuffle_seed):
            for batch in ds.batches(chunk, t.batch_size, shuffle_seed=shuffle_seed,
                                    epoch=epoch):
                loss = train_step(model, batch)
                best.trained()
                record.steps += 1
                record.samples += len(batch)
                check_loss(loss, step=record.steps, mode=cfg.mode, who="the run")
                timer.add(len(batch), loss)
                bar.update(len(batch))
                eval_now = record.samples >= next_eval
                if eval_now or record.steps % cfg.output.log_every_steps == 0:
                    line = _interval_record(cfg, record, timer)
                    bar.set_postfix(loss=f"{line['loss']:.4f}")
                    if eval_now:
                        line["eval"] = _select(cfg, ds, model, record, selection, best)
                        next_eval += eval_every
                    log.write(line)
                    timer.reset()
                    if eval_now and selection.should_stop:
                        say(selection.stop_line())
                        return EARLY_STOPPING
                if t.max_steps and record.steps >= t.max_steps:
                    return MAX_STEPS
    return EPOCHS


def eval_interval(t: TrainConfig, total_samples: int) -> int:
    """Training samples between evaluations: ``train.eval_every_samples``, or 0: eight per
    run of ``total_samples``."""
    return t.eval_every_samples or max(1, math.ceil(total_samples / 8))


def _interval_record(cfg: RunConfig, record: RunRecord, timer: StepTimer) -> dict:
    interval_s = time.perf_counter() - timer.start
    return {"time_s": record.time_s(), "samples": record.samples, "step": record.steps,
            "loss": timer.loss_sum / max(timer.samples, 1),
            "samples_per_s": timer.samples / interval_s if interval_s > 0 else None,
            "mode": cfg.mode, "worker_step_s": [interval_s / max(timer.steps, 1)],
            "staleness": None, "events": [], "eval": None}


def _select(cfg: RunConfig, ds: Dataset, model: LocalModel, record: RunRecord,
            selection: Selection, best: BestLocal) -> dict:
    """A periodic evaluation; with a validation slice, the model kept if it is the best."""
    result = _timed_eval(cfg, ds, model, record)
    if selection.observe(result, len(record.evals) - 1):
        best.save(model)
    return result


def _timed_eval(cfg: RunConfig, ds: Dataset, model: LocalModel, record: RunRecord) -> dict:
    start = time.perf_counter()
    split = periodic_split(ds)
    result = evaluate(model.dense, model.lookup, ds, cfg.train.eval_sample_rows,
                      cfg.train.eval_batch_size, split=split)
    took = time.perf_counter() - start
    record.eval_s += took  # training waited for all of it
    record.eval_total_s += took
    result.update(samples=record.samples, time_s=record.time_s(), eval_s=took, split=split)
    record.evals.append(result)
    return result


def periodic_split(ds: Dataset) -> str:
    """What the evaluations during training score: the validation slice where the run holds
    one out (train.validation), else the eval split."""
    return VALIDATION if ds.held else "eval"
