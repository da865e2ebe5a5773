"""Simulated workers: each one a process on the simulated clock running the worker half of its
mode (modes/) on a model replica of its own, with chunks from the real work queue
(worker/queue.py ChunkQueue) and a SimClient.

The loop is the worker's (worker/worker.py): take the next batch of a leased chunk (and the one
after it, for a mode that reads ahead), let the mode step on it, record the loss and the step's
simulated time, report the chunk done after its last step. What a step costs in simulated time
is the mode's own calls: its pulls and pushes travel and wait on the clock, its all-reduce
waits for the group, and its compute (between ``before_compute`` and ``after_compute``) takes
the measured cost times the worker's speed factor, whatever real time the arithmetic took.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

from recsync.modes.base import STOP, WorkerContext
from recsync.run.signals import check_loss
from recsync.simulation.client import SimClient, SimGroup
from recsync.simulation.clock import Clock
from recsync.simulation.timing import Timing, WorkerSpeeds
from recsync.worker.queue import ChunkQueue
from recsync.worker.feed import step_feed, straggle_factor

INTERVAL_KEYS = ("loss_sum", "loss_samples", "step_s", "interval_steps", "compute_s",
                 "compute_steps", "pull_wait_s", "push_wait_s")


class SimWorker:
    """One simulated worker (``model``: its replica; ``shards``: the SimShards)."""

    def __init__(self, rank: int, cfg, mode, model: torch.nn.Module, plan, ds, shards: list,
                 queue: ChunkQueue, clock: Clock, timing: Timing, speeds: WorkerSpeeds,
                 group: SimGroup | None):
        self.rank, self.cfg, self.ds, self.queue = rank, cfg, ds, queue
        self._jitter = np.random.default_rng((timing.speeds.seed, rank, 7))  # Timing.jitter
        self.clock, self.timing, self.speeds = clock, timing, speeds
        self.steps = self.samples = 0
        self.interval = dict.fromkeys(INTERVAL_KEYS, 0)
        self.taken: list = []
        self.finished_at: float | None = None
        self.on_step = lambda: None  # told after each step with a batch (periodic evaluations)
        self.rounds = None  # modes shadow and foreground: the trainer's rounds (rounds.py)
        # per step: this thread's real CPU before and after its compute (what Timing's
        # pull_side_s and push_side_s model; run.measure_sides takes their medians)
        self.real_sides_s: list[tuple[float, float]] = []
        self._real_compute_s = 0.0
        self._cpu_at_compute: float | None = None
        self._section_at = 0.0  # (Timing.paced) when the current section of a step began
        self.group = group
        self._collective_cpu_s = 0.0  # this step's all-reduces' own CPU, at factor 1
        client = SimClient(clock, shards, plan, push_window=cfg.cluster.push_window,
                           seed=hash((cfg.train.seed, rank)) % 2**32)
        client.dense_shard = 0 if mode.dense_on_ps else None
        self.ctx = WorkerContext(
            rank=rank, cfg=cfg, model=model, client=client,
            new_client=self._no_second_client, shards=shards,
            before_compute=self._before_compute, after_compute=self._after_compute,
            add_waits=self._add_waits,
            all_reduce=None if group is None else self._all_reduce, now=lambda: clock.now)
        self.mode = mode.worker(self.ctx)

    def pull_s(self) -> float | None:
        """This worker's training pulls' mean round trip (simulated seconds), or None."""
        c = self.ctx.client
        return c.pull_round_trip_s / c.pulls_timed if c.pulls_timed else None

    @staticmethod
    def _no_second_client():
        raise ValueError("the simulator runs one training thread per worker "
                         "(shadow.hogwild_threads > 1 is not simulated)")

    def factor(self) -> float:
        """How many times slower than the measured step this worker computes now: its speed
        (simulation/timing.py) times any emulated straggler of the config (faults.stragglers, on
        the simulated clock), times this step's jitter (Timing.jitter: its own part and the
        part common to every worker)."""
        now = self.clock.now
        f = self.speeds.factor(self.rank, now) * straggle_factor(self.cfg, self.rank, now)
        if self.timing.jitter:
            f *= float(np.exp(self.timing.jitter_log(self._jitter, now)))
        return f

    def _before_compute(self) -> None:
        self._cpu_at_compute = time.thread_time()
        if self.timing.paced:  # the section before the compute lasts at least its CPU
            self._pace(self.timing.pull_side_s)

    def _pace(self, cpu_s: float | None) -> None:
        """(Timing.paced) End a section of the step that lasts at least ``cpu_s`` x factor
        since it began, its waits counted toward it; the next section begins."""
        left = (cpu_s or 0.0) * self.factor() - (self.clock.now - self._section_at)
        if left > 0:
            self.clock.sleep(left)
        self._section_at = self.clock.now

    def _after_compute(self, real_s: float) -> None:
        """The mode computed a step (in ``real_s`` of real time): the simulated compute time
        passes, with the worker's CPU of the step before it (``Timing.pull_side_s``)."""
        self._real_compute_s += real_s
        factor = self.factor()
        compute_s = self.timing.compute_s * factor
        self.interval["compute_s"] += compute_s
        self.interval["compute_steps"] += 1
        if self.timing.paced:
            self.clock.sleep(compute_s)
            self._section_at = self.clock.now
        else:
            self.clock.sleep(compute_s + (self.timing.pull_side_s or 0.0) * factor)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        """The mode's all-reduce: the group's, and its CPU in this worker
        (``Timing.all_reduce_cpu_s``) charged after the step's compute (``_after_step``)."""
        self.group.all_reduce(tensor)
        self._collective_cpu_s += self.timing.all_reduce_cpu_s(
            tensor.numel() * tensor.element_size(), self.group.size)

    def _after_step(self, cpu_s: float, collective_s: float) -> None:
        """The worker's own CPU after its compute: ``cpu_s`` (push_side_s) and its all-reduces'
        ``collective_s``, at its factor. Paced, both are a floor that the section's waits (the
        all-reduce's among them) count toward. Else the CPU comes on top of the waits; the
        ring's time (``Timing.all_reduce_s``, fitted to an all-reduce's wall at full speed)
        holds the all-reduce's CPU at factor 1, so only a slower worker's extra is added."""
        if self.timing.paced:
            self._pace(cpu_s + collective_s)
        else:
            factor = self.factor()
            self.clock.sleep(cpu_s * factor + collective_s * max(0.0, factor - 1.0))

    def _add_waits(self, pull_s: float, push_s: float) -> None:
        self.interval["pull_wait_s"] += pull_s
        self.interval["push_wait_s"] += push_s

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Train until the mode stops (a process on the clock)."""
        slots = (0, 1) if self.mode.lookahead else (0,)
        feed = self._feed(slots)
        while True:
            self._section_at = self.clock.now  # (Timing.paced) taking the batch is in it
            batch, ahead, finished = next(feed)
            begin, cpu = self.clock.now, time.thread_time()
            self._real_compute_s, self._cpu_at_compute = 0.0, None
            loss = self.mode.step(batch, ahead, 0)
            collective_s, self._collective_cpu_s = self._collective_cpu_s, 0.0
            computed = self._cpu_at_compute is not None
            if computed:
                self.real_sides_s.append((self._cpu_at_compute - cpu, time.thread_time()
                                          - self._cpu_at_compute - self._real_compute_s))
            if computed or collective_s:  # the worker's own CPU after its compute
                self._after_step((self.timing.push_side_s or 0.0) if computed else 0.0,
                                 collective_s)
            if loss == STOP:
                self.mode.finish(0)
                self.finished_at = self.clock.now
                if self.rounds is not None:
                    self.rounds.final_rounds()
                return
            self._record(batch, loss, self.clock.now - begin)
            check_loss(loss, step=self.steps, mode=self.cfg.mode, who=f"worker {self.rank}")
            if self.rounds is not None:
                self.rounds.stepped()
            if finished is not None:
                self.queue.done(self.rank, *finished)

    def _feed(self, slots: tuple[int, ...]):
        """The worker's batches, step by step (worker/worker.py step_feed)."""
        return step_feed(self._batches(slots), len(slots) > 1, self.cfg.train.max_steps,
                         lambda: self.steps)

    def _batches(self, slots: tuple[int, ...]):
        """(batch, finished) of the chunks this worker takes, in turn in ``slots``; taking a
        chunk from the queue is a round trip on the clock."""
        t = self.cfg.train
        seed = t.seed if self.cfg.data.shuffle else None
        for k in itertools.count():
            slot = slots[k % len(slots)]
            self.clock.sleep(2 * self.timing.latency_s)
            item = self.queue.take(self.rank, slot)
            if item is None:
                return
            self.taken.append(item)
            epoch, chunk = item
            batches = list(self.ds.batches(chunk, t.batch_size, shuffle_seed=seed, epoch=epoch))
            if not batches:
                self.queue.done(self.rank, item, slot)
            for i, batch in enumerate(batches):
                yield batch, (item, slot) if i == len(batches) - 1 else None

    def _record(self, batch, loss, step_s: float) -> None:
        self.interval["step_s"] += step_s
        self.interval["interval_steps"] += 1
        if loss is not None:
            n = len(batch)
            self.steps += 1
            self.samples += n
            self.interval["loss_sum"] += loss * n
            self.interval["loss_samples"] += n
            self.on_step()

    def take_interval(self) -> dict:
        """The interval counters since the last call (a metrics line's)."""
        out, self.interval = self.interval, dict.fromkeys(INTERVAL_KEYS, 0)
        return out
