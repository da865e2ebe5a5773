"""``simulate``: a virtual cluster of N workers and S PS shards in one process, on a simulated
clock (docs/simulate.md).

The arithmetic is the real run's: the model built as every worker builds it, the shards' real
``ShardCore`` with the mode's rule (ps/build.py), the real work queue, the worker halves of the
modes and the PS client. Time is modelled (simulation/timing.py) and the order of events follows
from it (simulation/clock.py): which pushes a pull sees, so every gradient's staleness, comes out
of the event order, not from an assumption. No Ray runtime is started.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.nn.utils import vector_to_parameters

from recsync.config import RunConfig
from recsync.distributed.driver_model import DriverModel
from recsync.distributed.train import work_items
from recsync.metrics.core import MetricsLog
from recsync.metrics.evaluate import evaluate
from recsync.metrics.stats import distribution, merged_counts
from recsync.model import loss as model_loss
from recsync.model.compute import prepare
from recsync.modes import MODES
from recsync.modes.shadow import ShadowWorker
from recsync.ps.build import make_core
from recsync.run.driver import prepare_run_dir, resolved_for_data, write_outputs
from recsync.run.local_run import build_local_model, eval_interval, periodic_split
from recsync.run.preflight import preflight
from recsync.simulation.client import SimClient, SimGroup
from recsync.simulation.clock import Clock, on_one_core
from recsync.simulation.output import SimRecord, console_lines, simulated_summary
from recsync.simulation.rounds import SimRounds
from recsync.simulation.shards import InstantShard, SimShard
from recsync.simulation.timing import MEASURED, Speeds, Timing
from recsync.simulation.workers import SimWorker
from recsync.worker.queue import ChunkQueue

LINE_EVERY_S = 0.5  # simulated seconds between metrics lines (the watch loop's POLL_S)
CALIBRATION_STEPS = 7  # real steps timed for the compute cost (the first two are warm-up)


def refusal(cfg: RunConfig) -> str | None:
    """Why the simulator cannot run ``cfg`` faithfully (one line), or None."""
    simulated = [name for name, m in MODES.items() if m.simulated]
    if cfg.mode not in simulated:
        return (f"mode {cfg.mode!r} is not simulated yet (the simulator runs "
                f"{', '.join(simulated)})")
    mode_setting = MODES[cfg.mode].not_simulated(cfg)  # e.g. shadow's Hogwild threads
    unsupported = [
        (cfg.switching.enabled, "switching.enabled (mode switches)"),
        (cfg.recovery.kind != "none" or cfg.recovery.checkpoint_every_s > 0
         or cfg.recovery.mtbf_s > 0, "recovery (checkpoints and failures)"),
        (bool(cfg.faults.kills) or cfg.faults.kill_mean_s > 0, "faults.kills / kill_mean_s"),
        (cfg.train.patience > 0, "train.patience (early stopping)"),
        (bool(cfg.train.init_from), "train.init_from (warm start)"),
        (cfg.cluster.worker_gpus > 0, "cluster.worker_gpus"),
        (mode_setting is not None, mode_setting),
        (cfg.emulation.cores_per_worker > 0 or cfg.emulation.cores_per_shard > 0,
         "emulation (the simulator models time itself)"),
    ]
    named = [name for on, name in unsupported if on]
    if named:
        return f"the simulator does not model {', '.join(named)} yet: leave it out"
    return None


def measure_compute_s(cfg: RunConfig, ds) -> float:
    """One step's forward and backward on this machine, as a worker times it (the median of
    the steps after two of warm-up), with the config's model, batch and threads."""
    m = build_local_model(cfg.model, cfg.train, ds)
    chunk = ds.chunks("train", cfg.train.batch_size * CALIBRATION_STEPS)[0]
    times = []
    for batch in ds.batches(chunk, cfg.train.batch_size):
        pulled = m.lookup.pull(batch)
        begin = time.perf_counter()
        model_loss.loss(m.dense, batch, pulled.embeddings()).backward()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[2:] or times)


def measure_sides(cfg: RunConfig, ds, timing: Timing) -> tuple[float, float]:
    """A worker's own CPU per step before and after its forward and backward (Timing's
    ``pull_side_s``, ``push_side_s``), on this machine: one simulated worker's
    CALIBRATION_STEPS steps of ``cfg``'s mode, each timed on its thread (time.thread_time: the
    client's and the mode's work, not the shards'), the medians after two of warm-up."""
    from recsync.api import override
    probe = override(cfg, **{"cluster.workers": 1, "train.max_steps": CALIBRATION_STEPS})
    cluster = Cluster(probe, ds, replace(timing, speeds=Speeds()))
    worker = cluster.workers[0]
    cluster.start()
    cluster.clock.run(until=cluster.done)
    sides = worker.real_sides_s[2:] or worker.real_sides_s
    return (max(0.0, statistics.median(p for p, _ in sides)),
            max(0.0, statistics.median(q for _, q in sides)))


class Cluster:
    """The simulated cluster of one run: the clock, shards, queue, group and workers."""

    def __init__(self, cfg: RunConfig, ds, timing: Timing):
        self.cfg, self.ds, self.timing = cfg, ds, timing
        self.facts = MODES[cfg.mode]
        self.clock = Clock()
        model = DriverModel(cfg, ds)
        self.dense_model, self.plan = model.dense_model, model.plan
        dense_init = model.initial_dense()
        self.cores = [make_core(model.tables, cfg, s, dense_init if s == 0 else None)
                      for s in range(cfg.cluster.ps_shards)]
        self.shards = [SimShard(self.clock, c, timing) for c in self.cores]
        self.queue = ChunkQueue(work_items(cfg, ds))
        n = cfg.cluster.workers
        self.group = SimGroup(self.clock, n, timing) if self.facts.needs_group(cfg) else None
        self.speeds = timing.speeds.schedule(n)
        self.workers = []
        for rank in range(n):
            replica = copy.deepcopy(self.dense_model)
            prepare(replica, cfg.train.dense_precision, cfg.train.compile, who=f"worker {rank}")
            self.workers.append(SimWorker(rank, cfg, self.facts, replica, self.plan, ds,
                                          self.shards, self.queue, self.clock, timing,
                                          self.speeds, self.group))
        self.rounds = []  # modes shadow and foreground: each trainer's rounds
        for w in self.workers:
            if isinstance(w.mode, ShadowWorker):
                w.rounds = SimRounds(w, self.group)
                self.rounds.append(w.rounds)

    def start(self) -> None:
        """Every worker's process (and shadow thread) starts now."""
        for w in self.workers:
            self.clock.spawn(w.run, f"worker {w.rank}")
            if w.rounds is not None and w.rounds.background and not w.rounds.ended:
                self.clock.spawn(w.rounds.shadow_loop, f"shadow {w.rank}")

    def lookup(self) -> SimClient:
        """A client whose pulls read the shards at once, at no simulated cost (evaluations)."""
        return SimClient(self.clock, [InstantShard(self.clock, c) for c in self.cores],
                         self.plan)

    def dense_now(self) -> torch.nn.Module:
        """The model's dense parameters now, as the real run's end reads them: shard 0's
        (its rule's model_dense), else worker 0's replica."""
        vector = self.cores[0].rule.model_dense(self.cores[0])
        if vector is None:
            vector = self.workers[0].mode.dense_state()["params"]
        with torch.no_grad():
            vector_to_parameters(torch.as_tensor(vector), list(self.dense_model.parameters()))
        return self.dense_model

    def done(self) -> bool:
        return (all(w.finished_at is not None for w in self.workers)
                and all(r.ended for r in self.rounds))


class Watch:
    """The simulated run's watch loop: a metrics line every LINE_EVERY_S simulated seconds,
    and the periodic evaluations, as events on the clock."""

    def __init__(self, cluster: Cluster, log: MetricsLog, record: SimRecord):
        self.c, self.log, self.record = cluster, log, record
        t = cluster.cfg.train
        total = t.epochs * cluster.ds.rows("train")
        if t.max_steps:
            total = min(total, t.max_steps * t.batch_size * cluster.cfg.cluster.workers)
        self.eval_every = record.eval_every = eval_interval(t, total)
        self.next_eval = self.eval_every
        self.staleness_before: dict = {}
        self.last_s = 0.0
        self.samples = 0  # every worker's, as of the last step
        for w in cluster.workers:
            w.on_step = self.stepped
        cluster.clock.at(LINE_EVERY_S, self.tick)

    def stepped(self) -> None:
        """After any worker's step: an evaluation (and its line) once the samples trained
        reach the next one's, as the real run's watch loop does."""
        self.samples = sum(w.samples for w in self.c.workers)
        if self.samples >= self.next_eval:
            self.line(evaluate=True)
            while self.next_eval <= self.samples:
                self.next_eval += self.eval_every

    def close(self) -> None:
        """The last line, at the first tick at or after the last worker's end: the driver's
        watch loop (distributed/watch.py) sees the end only when it next polls, so a real
        run's last line includes up to a poll's wait (bench/overhead.py steady_rate leaves
        it out)."""
        end = self.c.clock.now
        if self.last_s < end or self.record.samples < self.samples:
            tick = math.ceil(end / LINE_EVERY_S - 1e-9) * LINE_EVERY_S
            self.c.clock.advance(max(end, tick))  # (an end a rounding error past a tick)
            self.line()

    def tick(self) -> None:
        if not self.c.done():
            self.line()
            self.c.clock.at(self.c.clock.now + LINE_EVERY_S, self.tick)

    def line(self, evaluate: bool = False) -> None:
        c, record = self.c, self.record
        intervals = [w.take_interval() for w in c.workers]
        samples = sum(w.samples for w in c.workers)
        loss_n = sum(i["loss_samples"] for i in intervals)
        interval_s = c.clock.now - self.last_s
        line = {"time_s": c.clock.now, "samples": samples,
                "step": max(w.steps for w in c.workers),
                "loss": sum(i["loss_sum"] for i in intervals) / loss_n if loss_n else None,
                "samples_per_s": (samples - record.samples) / interval_s if interval_s else None,
                "mode": c.cfg.mode,
                "worker_step_s": [_per_step(i, "step_s") for i in intervals],
                "worker_compute_s": [_per_step(i, "compute_s") for i in intervals],
                "staleness": self.staleness_since_last(), "events": [], "eval": None,
                "simulated": True}
        record.samples, record.steps = samples, line["step"]  # as the watch loop counts
        for key in ("step_s", "compute_s", "pull_wait_s", "push_wait_s", "interval_steps"):
            record.waits[key] = record.waits.get(key, 0) + sum(i[key] for i in intervals)
        if evaluate:
            line["eval"] = self.evaluate()
        self.last_s = c.clock.now
        self.log.write(line)

    def staleness_since_last(self) -> dict | None:
        now = merged_counts(core.staleness for core in self.c.cores)
        new = {k: n - self.staleness_before.get(k, 0) for k, n in now.items()
               if n > self.staleness_before.get(k, 0)}
        self.staleness_before = now
        return distribution(new) if new else None

    def evaluate(self) -> dict:
        """A periodic evaluation of the model as it is now (no simulated time: the real
        runtime evaluates beside training)."""
        c, t = self.c, self.c.cfg.train
        begin = time.perf_counter()
        split = periodic_split(c.ds)
        result = evaluate(c.dense_now(), c.lookup(), c.ds, t.eval_sample_rows,
                          t.eval_batch_size, split=split)
        took = time.perf_counter() - begin
        self.record.eval_total_s += took
        result.update(samples=self.record.samples, time_s=c.clock.now, eval_s=0.0,
                      real_eval_s=took, split=split)
        self.record.evals.append(result)
        return result


def _per_step(interval: dict, key: str) -> float | None:
    n = interval["interval_steps"]
    return interval[key] / n if n else None


def simulate(cfg: RunConfig, out: str | Path, *, timing: Timing | None = None,
             overwrite: bool = False) -> dict:
    """Simulate ``cfg`` (its ``cluster.workers`` and ``cluster.ps_shards``) and write a run's
    outputs into ``out``, labelled SIMULATED; returns the summary. ValueError (nothing
    written) for a config the simulator refuses (``refusal``)."""
    started = time.perf_counter()
    why = refusal(cfg)
    if why is not None:
        raise ValueError(f"recsync simulate: {why}")
    out = Path(out)
    timing = (timing or Timing()).on(cfg.cluster.transport)
    if cfg.network.enabled:
        timing = timing.with_network(cfg.network.latency_ms, cfg.network.ms_per_mb)
    ds = preflight(cfg, out)
    cfg = resolved_for_data(cfg, ds)
    prepare_run_dir(out, overwrite)
    (out / "config.toml").write_text(cfg.to_toml())
    torch.set_num_threads(cfg.train.threads)
    ds.hold_out(cfg.train.validation)
    measured = [name for name in MEASURED if getattr(timing, name) is None]
    if timing.compute_s is None:
        timing = replace(timing, compute_s=measure_compute_s(cfg, ds))
    if timing.pull_side_s is None or timing.push_side_s is None:
        pull_side, push_side = measure_sides(cfg, ds, replace(timing, pull_side_s=0.0,
                                                              push_side_s=0.0))
        timing = replace(timing, pull_side_s=pull_side if timing.pull_side_s is None
                         else timing.pull_side_s,
                         push_side_s=push_side if timing.push_side_s is None
                         else timing.push_side_s)
    cluster = Cluster(cfg, ds, timing)
    record = SimRecord(cluster.clock, start=started)
    record.train_start = time.perf_counter()  # real: when the simulated training began
    log = MetricsLog(out / "metrics.jsonl", upload_every_s=cfg.output.upload_every_s)
    try:
        watch = Watch(cluster, log, record)
        with on_one_core():  # the workers' threads hand control to each other
            cluster.start()
            cluster.clock.run(until=cluster.done)  # then only the next line is left
        record.sim_end_s = cluster.clock.now  # the last worker's end
        record.stop()
        ended = sum(core.rule.end(core) for core in cluster.cores)  # e.g. GBA's last batch
        watch.close()
        final = evaluate(cluster.dense_now(), cluster.lookup(), ds, ds.rows("eval"),
                         cfg.train.eval_batch_size)
        log.final_eval(final, record.samples)
    finally:
        log.close()
    summary = simulated_summary(cfg, ds, record, cluster, final, timing, measured, ended)
    write_outputs(cfg, out, summary)
    return summary


__all__ = ["simulate", "refusal", "console_lines", "Timing"]
