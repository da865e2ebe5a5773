"""Evaluations while a distributed run trains, without pausing it.

Every ``train.eval_every_samples`` (0: eight per run, as a local run) the watch loop starts one
on a thread of the driver: it copies the dense parameters now (shard 0's ``model_dense`` where
the PS holds them, else worker 0's replica) into a model of its own and scores the first
``train.eval_sample_rows`` eval rows (validation rows with ``train.validation``:
data/holdout.py) with rows pulled from the shards by a PSClient of its own. The workers go on training meanwhile, so the rows it reads are a few updates newer than the
dense parameters (the final evaluation, after training, is exact). One runs at a time; its
record joins the next metrics.jsonl line.

An evaluation that meets a shard or worker that is dead or restarting, or that a shard
recovery overtakes, is skipped and said so (an event); it never fails the run. The thread is a
daemon and stops at its next batch when the run ends (Ctrl-C, a failure), so it never keeps
the driver alive.
"""

from __future__ import annotations

import copy
import threading
import time

import ray
import torch
from torch.nn.utils import vector_to_parameters

from recsync.distributed.gather import gathered_rows
from recsync.embedding.row_optim import make_row_optimizer
from recsync.metrics.evaluate import evaluate
from recsync.model_dir.state import ModelState
from recsync.model_dir.trained import RowsLookup
from recsync.ps.client import PSClient
from recsync.run.local_run import eval_interval, periodic_split

FETCH_TIMEOUT_S = 30  # the dense parameters: a shard or worker that does not answer is down
STOP_WAIT_S = 5  # at the end: how long the driver waits for a stopped evaluation's thread


class Stopped(Exception):
    """The run ended while an evaluation was going on."""


class Unavailable(Exception):
    """The dense parameters cannot be read now (their worker is being replaced)."""


class _StoppableLookup:
    """A PSClient whose next pull raises Stopped once the run ends."""

    def __init__(self, client: PSClient, stop: threading.Event):
        self.client, self.stop = client, stop

    def pull(self, batch, read_only: bool = False):
        if self.stop.is_set():
            raise Stopped()
        return self.client.pull(batch, read_only=read_only)


class PeriodicEval:
    """The evaluations of one distributed run (handle.DistributedRun: its record, model,
    actors and clock are read); used by the watch loop only."""

    def __init__(self, run, total_samples: int):
        self.run = run
        self.every = run.record.eval_every = eval_interval(run.cfg.train, total_samples)
        self.next = self.every
        self.model = copy.deepcopy(run.model.dense_model)  # the thread's own
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.outcome: tuple | None = None  # set by the thread: ("done", record) / ("error", e)
        self.started: tuple = ()  # (samples, recoveries) when the one in flight started
        self.kept = None  # with a validation slice: the model the last one scored (best.py)
        best = getattr(run, "best", None)
        self.selecting = best is not None and best.enabled

    def start_if_due(self, samples: int, time_s: float) -> None:
        """Start one if ``samples`` reached the next evaluation and none is going on."""
        if self.thread is not None or samples < self.next:
            return
        while self.next <= samples:
            self.next += self.every
        self.started = (samples, len(self.run.record.recoveries))
        self.outcome = None
        self.thread = threading.Thread(target=self._evaluate, args=(samples, time_s),
                                       name="recsync-eval", daemon=True)
        self.thread.start()

    def collect(self, wait: bool = False) -> dict | None:
        """The record of the evaluation that ended since the last call (None if none did, or
        it was skipped: then an event says why). ``wait``: for the one going on (the end)."""
        if self.thread is None:
            return None
        if wait:
            self.thread.join()
        if self.thread.is_alive():
            return None
        self.thread = None
        kind, value = self.outcome
        record = self.run.record
        samples, recoveries = self.started
        cause = None
        if kind == "stopped":
            return None
        if kind == "error":
            if not isinstance(value, (ray.exceptions.RayError, Unavailable)):
                raise value  # a bug: the run fails with its traceback
            detail = (str(value).strip().splitlines() or [""])[0][:200]
            cause = (f"a shard or worker was not answering ({type(value).__name__}"
                     + (f": {detail})" if detail else ")"))
        elif len(record.recoveries) != recoveries:
            cause = "a shard recovery happened while it ran"
        if cause is not None:
            record.evals_skipped += 1
            record.event(time.time() - self.run.tallies.start_unix,
                         f"evaluation at {samples:,} samples skipped: {cause}")
            return None
        record.evals.append(value)
        record.eval_total_s += value["eval_s"]
        return value

    def close(self) -> None:
        """The run ends: an evaluation going on stops at its next batch."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=STOP_WAIT_S)

    # -- the thread ----------------------------------------------------------------------
    def _evaluate(self, samples: int, time_s: float) -> None:
        start = time.perf_counter()
        try:
            dense = self._dense()
            with torch.no_grad():
                vector_to_parameters(torch.tensor(dense, dtype=torch.float32),
                                     list(self.model.parameters()))
            fetched = time.perf_counter() - start
            client = PSClient(self.run.actors.shards, self.run.model.plan)
            self.kept = None
            if self.selecting:  # score a copy of the rows too, and keep it: best.py
                self.kept = self._copy()
                client = RowsLookup(self.run.model.plan, self.kept.tables, self.kept.trained,
                                    self.run.cfg.train.seed,
                                    self.run.cfg.model.embedding_init_scale)
            lookup = _StoppableLookup(client, self.stop)
            t = self.run.cfg.train
            split = periodic_split(self.run.ds)
            result = evaluate(self.model, lookup, self.run.ds, t.eval_sample_rows,
                              t.eval_batch_size, split=split)
            result.update(samples=samples, time_s=time_s, eval_s=time.perf_counter() - start,
                          dense_fetch_s=fetched, split=split)
            self.outcome = ("done", result)
        except Stopped:
            self.outcome = ("stopped", None)
        except BaseException as e:  # noqa: BLE001 - the watch loop decides (collect)
            self.outcome = ("error", e)

    def _copy(self) -> ModelState:
        """The model this evaluation scores, as OUT/model would keep it: the dense parameters
        just copied, the rows gathered from the shards now (and their optimizer state where
        the run saves it)."""
        cfg, actors = self.run.cfg, self.run.actors
        with_state = cfg.output.save_optimizer_state
        rows = gathered_rows(actors.shards, len(self.run.model.tables), with_state)
        optimizer = None
        if with_state:
            optimizer = ray.get(actors.shards[0].dense_optimizer_state.remote(),
                                timeout=FETCH_TIMEOUT_S)
            if optimizer is None and actors.live():
                state = ray.get(actors.workers[actors.live()[0]].dense_state.remote(),
                                timeout=FETCH_TIMEOUT_S)
                optimizer = None if state is None else state.get("optimizer")
        state_dim = make_row_optimizer(cfg.train.embedding_optimizer,
                                       cfg.train.embedding_lr).state_dim
        dense = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return ModelState(self.run.model.tables, dense, rows, optimizer, state_dim)

    def _dense(self):
        """A copy of the dense parameters now: shard 0's, or the first live worker's replica."""
        actors = self.run.actors
        dense = ray.get(actors.shards[0].call.remote("model_dense"), timeout=FETCH_TIMEOUT_S)
        if dense is not None:
            return dense
        live = actors.live()
        worker = actors.workers[live[0]] if live else None
        state = None if worker is None else ray.get(worker.dense_state.remote(),
                                                    timeout=FETCH_TIMEOUT_S)
        if state is None:  # being replaced, or the parameters are moving (a switch)
            raise Unavailable("no worker holds dense parameters now")
        return state["params"]
