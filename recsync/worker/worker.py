"""Worker: a Ray actor with a model replica, a PS client, chunks from the work queue, and the
worker half of its mode (modes/). Training runs on a thread of its own, so ``status`` is
answered even in the middle of a step.

Every mode runs the same loop (``_one_step``): take the next batch of a leased chunk (and the
one after it, for a mode that reads ahead), let the mode step on it, record the loss and the
time, report the chunk done after its last step, and pause if asked. A mode with several
training threads (Hogwild) runs that loop on each, with a chunk lease of its own.

Pauses (switching modes, checkpoint rounds): the driver asks every worker to pause
(``request_pause``). A worker pauses after a step, with its pushes applied: at its next step, or
in a mode that agrees on it (sync) after the step whose all-reduce carried the request, so all
pause after the same step. ``resume`` goes on, in another mode if the driver switched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback

import ray
import torch

from recsync.cluster import storage
from recsync.cluster.device import group_backend, worker_device
from recsync.cluster.emulation import EmulatedMachine, StepPacer, idle_cores, shadow_cores
from recsync.cluster.net import join_gloo_group, listening_socket
from recsync.cluster.placement import where
from recsync.config import RunConfig
from recsync.data.reader import Dataset
from recsync.distributed.status import INTERVAL_FIELDS
from recsync.model.compute import prepare, warm_up
from recsync.model.optim import import_optimizers
from recsync.model.setup import model_for
from recsync.modes import MODES
from recsync.modes.base import JOIN_REGROUP, STOP, WorkerContext
from recsync.ps.client import PSClient
from recsync.run.signals import check_loss, ignore_interrupts, known_cause
from recsync.worker.feed import step_feed, straggle_factor  # noqa: F401 (tests import it here)
from recsync.worker.leases import Leases

INTERVAL_KEYS = INTERVAL_FIELDS  # what status() reports since its previous call


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class Worker:
    def __init__(self, rank: int, cfg: RunConfig, shards: list, queue,
                 dense_state: dict | None = None, step_index: int = 0,
                 mode: str | None = None, directory=None):
        """``dense_state`` (another replica's or a checkpoint's, in the flat layout) and
        ``step_index`` let a rebuilt group go on where the old one stopped; ``mode``: the run's
        mode now (default ``cfg.mode``; it differs after a switch); ``directory``: the run's
        ShardDirectory if it keeps standby shards (ps/standby.py)."""
        ignore_interrupts()
        torch.set_num_threads(cfg.train.threads)
        self.rank, self.cfg, self.queue, self.shards = rank, cfg, queue, shards
        self.directory = directory
        self.ds = Dataset(storage.local_data(cfg.data.path))  # a URL: fetched to this node
        torch.manual_seed(cfg.train.seed)  # every replica starts from the driver's parameters
        built = model_for(cfg.model, self.ds)
        self.device = worker_device(cfg)  # a GPU with cluster.worker_gpus > 0
        self.model, self.plan = built.module.to(self.device), built.plan
        t, who = cfg.train, f"worker {rank}"
        prepare(self.model, t.dense_precision, t.compile, who=who)
        warm_up(self.model, self.plan, self.ds, t.batch_size, who=who)  # compiles, if set
        self.clients: list[PSClient] = []
        self.state, self.error = "created", None
        self.steps = self.samples = 0
        self._interval = dict.fromkeys(INTERVAL_KEYS, 0)
        self._pause_requested = threading.Event()
        self._leaving = threading.Event()  # told to leave: no chunk is taken any more
        self.leaving_since: float | None = None
        if cfg.cluster.elastic and threading.current_thread() is threading.main_thread():
            # a preemption notice: this worker drains as if the driver had told it to leave
            signal.signal(signal.SIGTERM, lambda *_: self.leave())
        self._resumed = threading.Event()
        self._resume_args: tuple = ()
        self._lock = threading.Lock()
        self._thread = None
        self._store_socket = None  # rank 0's, from address() until join_group
        self.batch_size = cfg.train.batch_size  # an elastic sync run's group sets its share
        # an elastic group's member leaves when the group is formed again without it: until
        # then it trains on (a SIGTERM only tells the driver) and asks the queue every step
        self.in_group = (cfg.cluster.elastic
                         and MODES[mode or cfg.mode].elastic_join(cfg) == JOIN_REGROUP)
        self.leases = Leases(rank, queue, self.ds, cfg, lambda: self.batch_size,
                             self._leaving.is_set, keep_asking=self.in_group)
        e = cfg.emulation  # the EMULATED cluster: this worker's machine and its threads' pacers
        self.machine = self.shadow_machine = None
        if shadow_cores(cfg) > 0:  # its rounds' CPU (its own thread's) is paid there, not here
            self.shadow_machine = EmulatedMachine(shadow_cores(cfg), cpu_clock=time.thread_time)
            self.machine = EmulatedMachine(e.cores_per_worker, cpu_clock=lambda: (
                time.process_time() - self.shadow_machine.cpu_s))
        elif e.cores_per_worker > 0:
            self.machine = EmulatedMachine(e.cores_per_worker)
        self.pacers: dict[str, StepPacer] = {}
        self._local = threading.local()
        self.start_time = time.time()
        self.mode_name = mode or cfg.mode
        self.mode = self._make_mode(self.mode_name, dense_state, step_index)
        if cfg.switching.enabled:  # a switch into sync builds the replicas' optimizer
            import_optimizers(cfg.train.dense_optimizer)

    # -- what the driver calls -------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        """The host and port this worker will serve the gloo group's store on: a socket that
        listens from now on, on this node's Ray address only (127.0.0.1 with the embedded Ray
        instance), kept for ``join_group``; torch's own store would listen on every interface."""
        host = ray.util.get_node_ip_address()
        if self._store_socket is not None:
            self._store_socket.close()
        self._store_socket = listening_socket(host)
        return host, self._store_socket.getsockname()[1]

    def join_group(self, host: str, port: int, world: int, group_rank: int | None = None,
                   batch_size: int | None = None) -> None:
        """Join the gloo group whose store ``address`` gave (the worker that gave it serves it),
        as ``group_rank`` (default: this worker's rank), leaving the group it was in (an
        elastic sync run's group changes while its workers are paused), with ``batch_size``
        rows a step from now on (its share of the global batch). With the store on loopback,
        every rank is on this machine: gloo's own connections then use the loopback interface
        too (unless GLOO_SOCKET_IFNAME says otherwise)."""
        sock, self._store_socket = self._store_socket, None
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        join_gloo_group(host, port, world, self.rank if group_rank is None else group_rank,
                        group_backend(self.device), sock)
        if batch_size is not None:
            self.batch_size = batch_size

    def start(self, start_time: float, dense_state: dict | None = None,
              step_index: int = 0) -> None:
        """Start training on a thread; ``start_time`` (epoch seconds) anchors fault schedules.
        ``dense_state``: a live replica's, for a worker joining an elastic run after it was
        built (the replica it was built with is older), at global step ``step_index``."""
        self.start_time = time.time() if start_time is None else start_time
        if dense_state is not None:
            self.mode = self._make_mode(self.mode_name, dense_state, step_index)
        self.state = "running"
        self._thread = threading.Thread(target=self._run, name=f"train-{self.rank}", daemon=True)
        self._thread.start()

    def status(self) -> dict:
        """Cumulative counts plus the loss and step time since the previous call."""
        with self._lock:
            interval = dict(self._interval)
            self._interval = dict.fromkeys(INTERVAL_KEYS, 0)
        return {"rank": self.rank, "state": self.state, "error": self.error, "steps": self.steps,
                "samples": self.samples, "pid": os.getpid(),
                "leaving_since": self.leaving_since,
                "lost_pushes": sum(c.lost_pushes for c in self.clients), **interval}

    def taken_chunks(self) -> list:
        return list(self.leases.taken)

    def positions(self) -> dict[tuple[int, int], int]:
        """{(rank, slot): rows of the chunk leased to that slot handed out to training}:
        while paused, each one's step is done (the data position of a job checkpoint)."""
        return {(self.rank, slot): n for slot, n in self.leases.position.items()}

    def dense_state(self) -> dict | None:
        """The dense state this worker's mode holds (modes/base.py), None where the PS does."""
        return self.mode.dense_state()

    def recovery_states(self) -> dict[int, dict]:
        """{step: dense state as of that step's start} (rebuilding a group). Answered from the
        actor thread even while training is blocked."""
        return self.mode.recovery_states()

    def pacing(self) -> dict | None:
        """The emulated cluster's figures of this worker (summed over its threads), or None."""
        if not self.pacers:
            return None
        training = [p for name, p in self.pacers.items() if name.startswith("train-")]
        own = [p for p in self.pacers.values() if p.machine is self.machine]
        shadow = [p for p in self.pacers.values() if p.machine is not self.machine]
        return {**StepPacer.summed(own),  # the rounds' work too, unless on a machine of theirs
                "steps": sum(p.steps for p in training),  # training steps only
                "unpaced_cpu_s": self.machine.unpaced_cpu_s(),
                "idle_cores": self.machine.idle_cores,
                "pull_round_trip_s": sum(c.pull_round_trip_s for c in self.clients),
                "pulls_timed": sum(c.pulls_timed for c in self.clients),
                "shadow_thread": StepPacer.summed(shadow) if shadow else None}

    def mode_stats(self) -> dict | None:
        """This worker's figures for its mode's summary section."""
        return self.mode.stats()

    def request_pause(self) -> None:
        """Pause after a step (see the module docstring); ``status`` then says "paused"."""
        self._pause_requested.set()

    def resume(self, mode: str, dense_state: dict | None = None, step_index: int = 0) -> None:
        """Go on training in ``mode``; into a mode whose replicas hold the dense parameters:
        from ``dense_state`` (the flat layout) at global step ``step_index``."""
        self._resume_args = (mode, dense_state, step_index)
        self._pause_requested.clear()
        self._resumed.set()

    def use_shards(self, handles: dict) -> None:
        """Shards that moved (a planned take-over): every call from now on, by every client and
        the mode, goes to their new processes (the list is shared)."""
        for i, handle in handles.items():
            self.shards[i] = handle

    def leave(self) -> None:
        """Leave the run (elastic runs): take no chunk any more, finish the ones held, push what
        was computed; ``status`` then says "left". A group's member only says so (its
        ``leaving_since``): it leaves when the driver forms the group again without it."""
        if self.leaving_since is None:
            self.leaving_since = time.time()
        if not self.in_group:
            self._leaving.set()

    def rounds(self, verb: str | None = None) -> dict:
        """An elastic shadow or foreground run's averaging rounds (MA, BMUF): pause, regroup,
        resume or leave them, and where they stand (ShadowWorker.rounds), with this worker's
        state."""
        return {**self.mode.rounds(verb), "state": self.state}

    def where(self) -> dict:
        """This process's node and pid (cluster/placement.py)."""
        return where()

    def die(self) -> None:
        """Fault injection: the process exits at once, as a crashed machine would."""
        os._exit(1)

    # -- the mode --------------------------------------------------------------------------
    def _new_client(self) -> PSClient:
        r = self.cfg.recovery
        client = PSClient(self.shards, self.plan, push_window=self.cfg.cluster.push_window,
                          survive_shard_restarts=r.kind != "none", directory=self.directory,
                          ssu_rate=r.ssu_rate if r.rows == "ssu" else 0.0,
                          seed=hash((self.cfg.train.seed, self.rank, len(self.clients))) % 2**32,
                          transport=self.cfg.cluster.transport)
        client.device = self.device
        self.clients.append(client)
        return client

    def _make_mode(self, name: str, dense_state: dict | None, step_index: int):
        mode = MODES[name]
        client = self.clients[0] if self.clients else self._new_client()
        client.dense_shard = 0 if mode.dense_on_ps else None
        ctx = WorkerContext(rank=self.rank, cfg=self.cfg, model=self.model, device=self.device,
                            client=client,
                            new_client=self._new_client, shards=self.shards,
                            dense_state=dense_state, step_index=step_index,
                            before_compute=self._before_compute,
                            after_compute=self._after_compute, paced=self._paced,
                            pause_requested=self._pause_requested.is_set,
                            add_waits=self._add_waits)
        return mode.worker(ctx)

    def _factor(self) -> float:
        return straggle_factor(self.cfg, self.rank, time.time() - self.start_time)

    def _pacer(self, name: str, machine=None) -> StepPacer | None:
        """This thread's pacer on the worker's emulated machine (None without emulation)."""
        machine = machine or self.machine
        if machine is None:
            return None
        if name not in self.pacers:
            self.pacers[name] = StepPacer(machine)
        return self.pacers[name]

    def _before_compute(self) -> None:
        pacer = getattr(self._local, "pacer", None)
        if pacer is not None:
            pacer.point(self._factor())  # the pull's own work, paced

    def _after_compute(self, compute_s: float) -> None:
        """Called by the mode between computing a step and sending it: counts compute time
        (what the mode controller compares) and emulates a straggler, as a machine ``factor``
        times slower would take: on the emulated cluster by pacing its compute on factor x its
        cores' time, else by sleeping (factor - 1) x the compute time."""
        factor = self._factor()
        pacer = getattr(self._local, "pacer", None)
        if pacer is not None:
            compute_s += pacer.point(factor, compute=True)
            straggle_s = compute_s * (1.0 - 1.0 / factor)
        else:
            straggle_s = (factor - 1.0) * compute_s
            if factor > 1.0:
                time.sleep(straggle_s)
            compute_s += straggle_s
        # held until the step is recorded, so that a poll sees a step's compute time with the
        # step (a step may straddle polls: the controller compares time per step)
        local = self._local
        local.compute_s = getattr(local, "compute_s", 0.0) + compute_s
        local.straggle_s = getattr(local, "straggle_s", 0.0) + straggle_s

    @contextlib.contextmanager
    def _paced(self, background: bool = False):
        """A section of work outside the training steps (a shadow round), paced on this
        worker's emulated cores, or those of its shadow thread (``background``) if it has
        its own (``emulation.cores_per_shadow``)."""
        machine = self.shadow_machine if background else None
        pacer = self._pacer(f"{threading.current_thread().name}:rounds", machine)
        if pacer is None:
            yield
            return
        pacer.begin()
        try:
            yield
        finally:
            pacer.end(self._factor())

    def _add_waits(self, pull_s: float, push_s: float) -> None:
        with self._lock:
            self._interval["pull_wait_s"] += pull_s
            self._interval["push_wait_s"] += push_s

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.machine is not None:  # the emulated machine is charged what is above it
                self.machine.set_idle(idle_cores())
            slots = [(2 * t, 2 * t + 1) if self.mode.lookahead else (t,)
                     for t in range(self.mode.threads)]
            feeds = [self._feed(s) for s in slots]
            self.mode.run([lambda t=t: self._one_step(t, feeds[t])
                           for t in range(self.mode.threads)])
            self.state = "left" if self.leases.left_early else "done"  # else: out of data
        except Exception as e:  # reported through status(); the driver decides what to do
            known = known_cause(e)  # bad data, a diverging model: one line, no traceback
            self.error = known or f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
            self.state = "error"

    def _one_step(self, thread: int, feed) -> bool:
        """One step of training thread ``thread``; False once it has stopped."""
        pacer = self._local.pacer = self._pacer(f"train-{thread}")
        if pacer is not None:
            pacer.begin()  # reading the batch is part of the step's work
        batch, ahead, finished = next(feed)
        begin = time.perf_counter()
        loss = self.mode.step(batch, ahead, thread)
        if loss == STOP:
            self.mode.finish(thread)
            return False
        if pacer is not None:
            pacer.end(self._factor(), count=loss is not None)
        self._record(batch, loss, time.perf_counter() - begin)
        check_loss(loss, step=self.steps, mode=self.mode_name, who=f"worker {self.rank}")
        if finished is not None:
            self.leases.done(*finished)
        if self.mode.agreed_pause():
            self._pause()
        return True

    def _feed(self, slots: tuple[int, ...]):
        """(batch, the batch after it or None, finished) for each step (``step_feed``) of the
        chunks leased to ``slots``."""
        steps = ((lambda: self.mode.step_index) if self.in_group  # the group's global step
                 else (lambda: self.steps))
        return step_feed(self.leases.batches(slots), len(slots) > 1, self.cfg.train.max_steps,
                         steps)

    def _record(self, batch, loss: float | None, step_s: float) -> None:
        local = self._local
        compute_s, straggle_s = getattr(local, "compute_s", 0.0), getattr(local, "straggle_s", 0.0)
        local.compute_s = local.straggle_s = 0.0
        with self._lock:
            self._interval["step_s"] += step_s
            self._interval["interval_steps"] += 1
            self._interval["compute_s"] += compute_s
            self._interval["straggle_s"] += straggle_s
            self._interval["compute_steps"] += loss is not None
            if loss is not None:
                n = len(batch)
                self.steps += 1
                self.samples += n
                self._interval["loss_sum"] += loss * n
                self._interval["loss_samples"] += n

    def _pause(self) -> None:
        """Pause until ``resume``; then go on, in the mode the driver says."""
        self.mode.finish()  # every push applied: nothing in flight crosses a switch
        self.state = "paused"
        self._resumed.wait()
        self._resumed.clear()
        mode_name, dense_state, step_index = self._resume_args
        if mode_name != self.mode_name:  # else the pause was for a checkpoint, or called off
            self.mode_name = mode_name
            self.mode = self._make_mode(mode_name, dense_state, step_index)
        self.state = "running"
