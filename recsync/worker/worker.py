"""Worker: a Ray actor with a model replica, a PS client, chunks from the work queue, and the
step function of its sync mode. Training runs on a thread of its own, so ``status`` is answered
even in the middle of a step.

Modes shadow and foreground run a HogwildTrainer instead (worker/hogwild.py): several training
threads, each with its own PS client and chunk lease, on one dense replica, and the rounds that
keep the replicas of all workers in step.

Switching between sync and gba: the driver asks every worker to pause (``request_pause``). A
worker pauses after a step, with its pushes applied: in gba at its next step, in sync after the
step whose all-reduce carried the request (so all pause after the same step). The driver moves
the dense parameters, then ``resume`` starts the new mode where the batches left off.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import os
import socket
import threading
import time
import traceback

import numpy as np
import ray
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recsync.config import RunConfig
from recsync.data.reader import Dataset
from recsync.model.registry import build_model
from recsync.ps.client import PSClient
from recsync.sync import HOGWILD_MODES, PS_DENSE_MODES, SYNC_MODES
from recsync.sync.base import STOP
from recsync.sync.handover import from_flat, to_flat
from recsync.sync.shadow import AveragingSync, DenseReplica, ElasticSync, HogwildStep
from recsync.sync.shadow_rules import BMUF
from recsync.model.optim import DENSE_OPTIMIZERS
from recsync.model.registry import table_rows_for
from recsync.worker.hogwild import HogwildTrainer


SHADOW_TIMEOUT_S = 300  # a shadow round waits this long for the other trainers before failing


def straggle_factor(cfg: RunConfig, rank: int, elapsed_s: float) -> float:
    """How many times slower this worker must run now (emulated stragglers; 1.0 = normal)."""
    factor = 1.0
    for s in cfg.faults.stragglers:
        if s.worker == rank and s.start_s <= elapsed_s < s.end_s:
            factor = max(factor, s.factor)
    return factor


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class Worker:
    def __init__(self, rank: int, cfg: RunConfig, shards: list, queue,
                 dense_state: dict | None = None, step_index: int = 0,
                 mode: str | None = None):
        """``dense_state`` (from another replica's ``dense_state()``) and ``step_index`` let a
        rebuilt sync group continue where the old one stopped; ``mode``: the run's mode now
        (default ``cfg.mode``; it differs after a switch)."""
        torch.set_num_threads(cfg.train.threads)
        self.rank, self.cfg, self.queue = rank, cfg, queue
        self.ds = Dataset(cfg.data.path)
        torch.manual_seed(cfg.train.seed)  # every replica starts from the driver's parameters
        self.model, tables = build_model(cfg.model, self.ds.meta["num_dense"], self.ds.table_names,
                                         table_rows_for(cfg.model, self.ds.table_rows))
        self.mode_name = mode or cfg.mode
        self.shards, self.dims = shards, [t.dim for t in tables]
        self.client = self._ps_client()
        self.optimizer = self.replica = self.hogwild = None
        if cfg.mode == "sync" or cfg.switching.enabled:
            self.optimizer = DENSE_OPTIMIZERS[cfg.train.dense_optimizer](
                self.model.parameters(), lr=cfg.train.dense_lr)
        if dense_state is not None:
            self._load_dense(dense_state)
        if cfg.mode in HOGWILD_MODES:
            self.replica = DenseReplica(self.model, DENSE_OPTIMIZERS[cfg.train.dense_optimizer],
                                        cfg.train.dense_lr)
        self.step_index = step_index
        self.mode = None
        self.state, self.error = "created", None
        self.steps = self.samples = 0
        self._interval = {"loss_sum": 0.0, "loss_samples": 0, "step_s": 0.0,
                          "interval_steps": 0, "straggle_s": 0.0, "compute_s": 0.0,
                          "pull_wait_s": 0.0, "push_wait_s": 0.0}
        self._pause_requested = threading.Event()
        self._resumed = threading.Event()
        self._resume_args: tuple = ()
        self._lock = threading.Lock()
        self._thread = None
        self.taken: list = []  # (epoch, chunk) in the order this worker trained on them
        self.position: dict[int, int] = {}  # slot -> batches of its leased chunk handed out

    def _ps_client(self) -> PSClient:
        r = self.cfg.recovery
        self._clients = getattr(self, "_clients", 0) + 1  # a seed per client (Hogwild threads)
        return PSClient(self.shards, self.dims, push_window=self.cfg.cluster.push_window,
                        survive_shard_restarts=r.kind != "none",
                        ssu_rate=r.ssu_rate if r.rows == "ssu" else 0.0,
                        seed=hash((self.cfg.train.seed, self.rank, self._clients)) % 2**32)

    def address(self) -> tuple[str, int]:
        """A host and free port for rank 0 to host the gloo group on."""
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return host, s.getsockname()[1]

    def join_group(self, host: str, port: int, world: int) -> None:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=world, timeout=dt.timedelta(seconds=60))

    def start(self, start_time: float) -> None:
        """Start training on a thread; ``start_time`` (epoch seconds) anchors fault schedules."""
        self.start_time = time.time() if start_time is None else start_time
        self.state = "running"
        self._thread = threading.Thread(target=self._run, name=f"train-{self.rank}", daemon=True)
        self._thread.start()

    def status(self) -> dict:
        """Cumulative counts plus the loss and step time since the previous call."""
        with self._lock:
            interval = dict(self._interval)
            for k in self._interval:
                self._interval[k] = 0 if isinstance(self._interval[k], int) else 0.0
        return {"rank": self.rank, "state": self.state, "error": self.error, "steps": self.steps,
                "samples": self.samples, "pid": os.getpid(), **interval}

    def taken_chunks(self) -> list:
        return list(self.taken)

    def positions(self) -> dict[tuple[int, int], int]:
        """{(rank, slot): batches of the chunk leased to that slot handed out to training}:
        while paused, each one's step is done (the data position of a job checkpoint)."""
        return {(self.rank, slot): n for slot, n in self.position.items()}

    def dense_vector(self) -> np.ndarray:
        return parameters_to_vector(self.model.parameters()).detach().numpy()

    def dense_states(self) -> dict[int, dict]:
        """Sync: {step: dense parameters and optimizer state as of that step's start}, to seed a
        rebuilt group. Answered from the actor thread even while training is blocked."""
        if self.mode is None:
            raise RuntimeError(f"worker {self.rank} has not started")
        return self.mode.dense_states()

    def request_pause(self) -> None:
        """Pause after a step (see the module docstring); ``status`` then says "paused"."""
        self._pause_requested.set()

    def dense_handover(self) -> dict:
        """While paused in sync: the replica's dense parameters and optimizer state in the
        PS's flat layout (sync/handover.py)."""
        shapes = [p.shape for p in self.model.parameters()]
        return {"params": self.dense_vector().copy(),
                "optimizer": to_flat(self.optimizer.state_dict(), shapes)}

    def resume(self, mode: str, dense_state: dict | None = None, step_index: int = 0) -> None:
        """Go on training in ``mode``; to sync: from ``dense_state`` (the PS's flat layout) at
        global step ``step_index``."""
        self._resume_args = (mode, dense_state, step_index)
        self._pause_requested.clear()
        self._resumed.set()

    def die(self) -> None:
        """Fault injection: the process exits at once, as a crashed machine would."""
        os._exit(1)

    def shadow_stats(self) -> dict:
        """Modes shadow and foreground: the sync rounds of this trainer (worker/hogwild.py)."""
        h = self.hogwild
        if h is None:
            raise RuntimeError(f"worker {self.rank} runs no Hogwild trainer (mode "
                               f"{self.mode_name})")
        return {"rounds": h.stats.rounds, "final_rounds": h.stats.final_rounds,
                "round_s": h.stats.round_s, "gaps": dict(h.stats.gaps),
                "iterations": h.iterations, "train_s": h.train_s(),
                "threads_alive": h.threads_alive()}

    def _batches(self, slot: int = 0):
        """Batches of the chunks this worker's thread ``slot`` leases, one chunk at a time;
        a chunk is reported done when the next batch is asked for after its last one (whose
        step is then done)."""
        for batch, finished in self._leased_batches((slot,)):
            yield batch
            if finished is not None:
                self._chunk_done(*finished)

    def _leased_batches(self, slots: tuple[int, ...]):
        """(batch, finished): ``finished`` is (chunk, slot) on the last batch of a chunk, for
        the caller to report done once that batch's step is done. Successive chunks take
        turns in ``slots``: with two, a caller may look a batch ahead into the next chunk
        while the last step of the current one is under way."""
        t = self.cfg.train
        seed = t.seed if self.cfg.data.shuffle else None
        for k in itertools.count():
            slot = slots[k % len(slots)]
            taken = ray.get(self.queue.take_with_skip.remote(self.rank, slot))
            if taken is None:
                return
            item, skip = taken
            epoch, chunk = item
            self.taken.append(item)
            self.position[slot] = skip
            previous = None
            batches = self.ds.batches(chunk, t.batch_size, shuffle_seed=seed, epoch=epoch)
            for batch in itertools.islice(batches, skip, None):  # skip: trained before a restore
                if previous is not None:
                    self.position[slot] += 1
                    yield previous, None
                previous = batch
            if previous is None:
                self._chunk_done(item, slot)
            else:
                self.position[slot] += 1
                yield previous, (item, slot)

    def _chunk_done(self, item, slot: int) -> None:
        ray.get(self.queue.done.remote(self.rank, item, slot))

    def _load_dense(self, dense_state: dict, flat: bool = False) -> None:
        with torch.no_grad():
            vector_to_parameters(torch.tensor(dense_state["params"]),
                                 list(self.model.parameters()))
        if self.optimizer is not None and dense_state.get("optimizer") is not None:
            state = dense_state["optimizer"]
            if flat:
                state = from_flat(state, [p.shape for p in self.model.parameters()])
            self.optimizer.load_state_dict(state)

    def _make_mode(self):
        self.client.dense_shard = 0 if self.mode_name in PS_DENSE_MODES else None
        if self.mode_name == "sync":
            mode = SYNC_MODES["sync"](self.model, self.client, self.optimizer, self.step_index)
        elif self.mode_name == "eager":
            mode = SYNC_MODES["eager"](self.model, self.client, overlap=self.cfg.eager.overlap,
                                       lr_modulation=self.cfg.eager.lr_modulation)
            mode.add_waits = self._add_waits
        else:
            mode = SYNC_MODES[self.mode_name](self.model, self.client)
        mode.after_compute = self._after_compute
        mode.pause_requested = self._pause_requested.is_set
        return mode

    def _after_compute(self, compute_s: float) -> None:
        """Called by the mode between computing a step and sending it: counts compute time
        (what the mode controller compares) and emulates a straggler, which sleeps
        (factor - 1) x the compute time, as a machine ``factor`` times slower would take."""
        factor = straggle_factor(self.cfg, self.rank, time.time() - self.start_time)
        if factor > 1.0:
            time.sleep((factor - 1.0) * compute_s)
        with self._lock:
            self._interval["straggle_s"] += (factor - 1.0) * compute_s
            self._interval["compute_s"] += factor * compute_s

    def _pause(self, mode):
        """Pause until ``resume``; returns the mode to go on with."""
        mode.finish()  # every push applied: nothing in flight crosses a switch
        self.state = "paused"
        self._resumed.wait()
        self._resumed.clear()
        mode_name, dense_state, step_index = self._resume_args
        if mode_name != self.mode_name:  # else the switch was called off: go on as before
            self.mode_name = mode_name
            if mode_name == "sync":
                self._load_dense(dense_state, flat=True)
                self.step_index = step_index
            self.mode = mode = self._make_mode()
        self.state = "running"
        return mode

    def _next_batch(self, batches):
        max_steps = self.cfg.train.max_steps
        return next(batches, None) if not max_steps or self.steps < max_steps else None

    def _record(self, batch, loss: float | None, step_s: float) -> None:
        with self._lock:
            self._interval["step_s"] += step_s
            self._interval["interval_steps"] += 1
            if loss is not None:
                n = len(batch)
                self.steps += 1
                self.samples += n
                self._interval["loss_sum"] += loss * n
                self._interval["loss_samples"] += n

    def _add_waits(self, pull_s: float, push_s: float) -> None:
        with self._lock:
            self._interval["pull_wait_s"] += pull_s
            self._interval["push_wait_s"] += push_s

    def _run(self) -> None:
        try:
            if self.mode_name in HOGWILD_MODES:
                self._run_hogwild()
            elif self.mode_name == "eager":
                self._run_eager()
            else:
                self._run_mode()
            self.state = "done"
        except Exception as e:  # reported through status(); the driver decides what to do
            self.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
            self.state = "error"

    def _run_mode(self) -> None:
        self.mode = mode = self._make_mode()
        batches = self._batches()
        while True:
            batch = self._next_batch(batches)
            begin = time.perf_counter()
            loss = mode.step(batch)
            if loss == STOP:
                break
            self._record(batch, loss, time.perf_counter() - begin)
            if mode.agreed_pause():
                mode = self._pause(mode)
        mode.finish()

    def _run_eager(self) -> None:
        """Mode eager: the step is given the next batch too, so that it can send that batch's
        pull before computing this one. A chunk is reported done after its last step."""
        self.mode = mode = self._make_mode()
        max_steps = self.cfg.train.max_steps
        source = self._leased_batches((0, 1))  # the batch ahead may be the next chunk's
        current = next(source, None)
        while current is not None and not (max_steps and self.steps >= max_steps):
            ahead = None if max_steps and self.steps + 1 >= max_steps else next(source, None)
            begin = time.perf_counter()
            loss = mode.step(current[0], ahead[0] if ahead else None)
            self._record(current[0], loss, time.perf_counter() - begin)
            if current[1] is not None:
                self._chunk_done(*current[1])
            current = ahead
        mode.finish()

    def eager_stats(self) -> dict:
        """Mode eager: τ as this worker knew it, and the learning-rate multipliers applied."""
        if self.mode_name != "eager" or self.mode is None:
            raise RuntimeError(f"worker {self.rank} is not training in mode eager")
        return self.mode.stats()

    def _run_hogwild(self) -> None:
        """Modes shadow and foreground: ``shadow.hogwild_threads`` training threads (each with
        its own PS client and chunk lease) and the synchronizer of ``shadow.algorithm``."""
        sh = self.cfg.shadow

        def one_step(step: HogwildStep, batches) -> bool:
            batch = self._next_batch(batches)
            begin = time.perf_counter()
            loss = step.step(batch)
            if loss == STOP:
                step.finish()  # every row push applied
                return False
            self._record(batch, loss, time.perf_counter() - begin)
            return True

        steps = []
        for slot in range(sh.hogwild_threads):
            step = HogwildStep(self.replica, self._ps_client())
            step.after_compute = self._after_compute
            steps.append(functools.partial(one_step, step, self._batches(slot)))
        self.hogwild = HogwildTrainer(steps, self._make_synchronizer(),
                                      background=self.mode_name == "shadow",
                                      every=sh.foreground_every,
                                      min_interval_s=sh.min_interval_s)
        self.hogwild.run()

    def _make_synchronizer(self):
        sh, trainers = self.cfg.shadow, self.cfg.cluster.workers
        if sh.algorithm == "none":
            return None
        if sh.algorithm == "easgd":
            return ElasticSync(self.replica, self.shards[0], sh.alpha(trainers),
                               survive_shard_restarts=self.cfg.recovery.kind != "none")
        import torch.distributed as dist
        group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=SHADOW_TIMEOUT_S))
        bmuf = None
        if sh.algorithm == "bmuf":
            bmuf = BMUF(self.replica.vector(), sh.momentum(trainers), sh.bmuf_lr,
                        sh.bmuf_nesterov)
        return AveragingSync(self.replica, group, trainers, bmuf)
