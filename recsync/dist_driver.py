"""A distributed run (modes sync, async, gba, shadow, foreground, eager): PS shards, a work queue
and workers on Ray.

The driver builds everything, then watches: it polls worker status for metrics and progress,
injects configured faults, and decides what a failure means:

- a worker died, async or gba: a new worker takes its rank; its leased chunk went back to the
  queue (gba: the dead worker's token never returns, and the shards' buffers fill without it).
- a worker died, sync: the group is rebuilt. The dense parameters and optimizer state are taken
  from a live replica, the PS forgets the incomplete step, every lease goes back to the queue,
  and fresh workers start at the PS's step on a new gloo group.
- a worker died, shadow or foreground: the dense replicas restart from a live one's (their
  optimizer state starts afresh); with "ma" and "bmuf" every worker restarts on a new group
  (a replacement cannot join the old one), with "easgd" and "none" only the dead one.
- a PS shard died: with ``recovery.kind = "partial"`` Ray restarts it, it reloads its own last
  checkpoint, the workers' pulls wait for it and their pushes in flight to it are lost; the
  driver logs the recovery and counts the lost samples (PLS). Otherwise the run stops with an
  error naming the shard.

Switching between sync and gba (``[switching]``: a schedule, or the mode controller watching
per-worker compute times): every worker pauses after a step with its pushes applied, the dense
parameters and optimizer state move between the replicas and PS shard 0, and the workers resume
in the other mode (``DistributedRun.switch``).

At the end it evaluates the trained model through the PS and returns what the summary needs.
"""

from __future__ import annotations

import functools
import random
import time
from pathlib import Path

import numpy as np
import ray
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from tqdm import tqdm

from recsync.checkpoint.interval import choose
from recsync.config import RunConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.embedding.row_optim import make_row_optimizer
from recsync.metrics import MetricsLog
from recsync.model.registry import build_model
from recsync.ps.client import PSClient
from recsync.ps.aggregation import StalenessDecay, as_tensor
from recsync.ps.core import DenseState, ShardCore
from recsync.ps.shard import PSShard
from recsync.sync import HOGWILD_MODES, PS_DENSE_MODES
from recsync.sync.controller import ModeController
from recsync.trainer import LocalModel, evaluate, table_rows_for
from recsync.worker.queue import WorkQueue
from recsync.worker.worker import Worker

POLL_S = 0.5
SWITCH_TIMEOUT_S = 120  # a worker pauses after its current step: minutes mean it is stuck
MAX_WORKER_RESTARTS = 20  # per run: a crash loop must end in an error, not go on forever
MAX_SHARD_RESTARTS = 20  # per shard, partial recovery
SHARD_RESTART_WAIT_S = 60  # partial recovery: how long a restarting shard may take to answer


class RunFailed(RuntimeError):
    """The run cannot go on (e.g. a PS shard died without a checkpoint); says which and why."""


def _needs_group(cfg: RunConfig) -> bool:
    """Whether the workers form a gloo group: sync, switching, and the averaging shadow modes."""
    return (cfg.mode == "sync" or cfg.switching.enabled
            or (cfg.mode in HOGWILD_MODES and cfg.shadow.algorithm in ("ma", "bmuf")))


def _holds_center(cfg: RunConfig) -> bool:
    return cfg.mode in HOGWILD_MODES and cfg.shadow.algorithm == "easgd"


def _make_core(tables, cfg: RunConfig, shard: int, dense_init: np.ndarray | None) -> ShardCore:
    """Shard ``shard``'s core; ``dense_init`` (given to shard 0 only) becomes its dense
    parameters in PS modes, or EASGD's center copy."""
    t = cfg.train
    dense = center = None
    if dense_init is not None and cfg.mode in PS_DENSE_MODES:
        dense = DenseState(as_tensor(dense_init), t.dense_optimizer, t.dense_lr)
    elif dense_init is not None and _holds_center(cfg):
        center = as_tensor(dense_init)
    return ShardCore(tables, make_row_optimizer(t.embedding_optimizer, t.embedding_lr),
                     shard=shard, num_shards=cfg.cluster.ps_shards,
                     num_workers=cfg.cluster.workers, seed=t.seed,
                     init_scale=cfg.model.embedding_init_scale, dense=dense,
                     gba_gradients=cfg.gba.gradients_per_update,
                     decay=StalenessDecay(cfg.gba.staleness_threshold, cfg.gba.decay),
                     center=center)


class DistributedRun:
    """The actors of one run and the few things the driver does with them."""

    def __init__(self, cfg: RunConfig, ds: Dataset, progress, checkpoint_root: Path | None = None):
        """``checkpoint_root``: where the shards' checkpoints go if ``recovery`` asks for them
        (``recovery.dir`` wins)."""
        self.cfg, self.ds, self.progress = cfg, ds, progress
        c, t = cfg.cluster, cfg.train
        torch.manual_seed(t.seed)
        self.dense_model, self.tables = build_model(cfg.model, ds.meta["num_dense"],
                                                    ds.table_names,
                                                    table_rows_for(cfg.model, ds.table_rows))
        dense_init = parameters_to_vector(self.dense_model.parameters()).detach().numpy()
        net = cfg.network
        network = (net.latency_ms / 1e3, net.ms_per_mb / 1e3 / 2**20) if net.enabled else None
        self.checkpoint_dir = None
        if cfg.recovery.checkpoint_every_s or cfg.recovery.mtbf_s:
            root = Path(cfg.recovery.dir) if cfg.recovery.dir else checkpoint_root
            if root is None:
                raise ValueError("recovery.checkpoint_every_s is set but there is no directory "
                                 "for checkpoints: set recovery.dir")
            self.checkpoint_dir = root.resolve()
        restarts = MAX_SHARD_RESTARTS if cfg.recovery.kind == "partial" else 0
        self.shards = [PSShard.options(max_restarts=restarts).remote(functools.partial(
            _make_core, self.tables, cfg, s,
            dense_init if s == 0 else None), network,
            None if self.checkpoint_dir is None else str(self.checkpoint_dir / f"shard-{s}"),
            cfg.recovery.keep)
            for s in range(c.ps_shards)]
        chunks = ds.chunks("train", cfg.data.chunk_rows or 16 * t.batch_size)
        seed = t.seed if cfg.data.shuffle else None
        self.queue = WorkQueue.remote([(e, ch) for e in range(t.epochs)
                                       for ch in chunk_order(chunks, epoch=e, shuffle_seed=seed)])
        self.workers: list = [None] * c.workers
        self.done_before = [{"samples": 0, "steps": 0} for _ in range(c.workers)]  # dead ones'
        self.last = [{"samples": 0, "steps": 0} for _ in range(c.workers)]
        self.taken: list[list] = [[] for _ in range(c.workers)]
        self.restarts = 0
        self.start = 0.0  # epoch seconds when training starts: fault schedules count from it
        self.mode = cfg.mode  # the mode now: sync and gba switch during a run
        self.shard_seen: dict[int, dict] = {}  # partial recovery: each shard's last incarnation

    # -- workers -------------------------------------------------------------------------
    def start_workers(self, ranks: list[int], dense_state: dict | None = None,
                      step_index: int = 0) -> None:
        for r in ranks:
            self.workers[r] = Worker.remote(r, self.cfg, self.shards, self.queue, dense_state,
                                            step_index, self.mode)
        if _needs_group(self.cfg):
            host, port = ray.get(self.workers[0].address.remote())
            ray.get([w.join_group.remote(host, port, len(self.workers)) for w in self.workers])
        ray.get([self.workers[r].start.remote(self.start) for r in ranks])

    def poll(self) -> list[dict]:
        """Every worker's status; a dead worker reads as state "dead"."""
        refs = [w.status.remote() for w in self.workers]
        out = []
        for r, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=30))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                out.append({"rank": r, "state": "dead", "error": None, **self.last[r],
                            "loss_sum": 0.0, "loss_samples": 0, "step_s": 0.0,
                            "interval_steps": 0, "straggle_s": 0.0, "compute_s": 0.0,
                            "pull_wait_s": 0.0, "push_wait_s": 0.0})
        for s in out:
            self.last[s["rank"]] = {"samples": s["samples"], "steps": s["steps"]}
        return [{**s, "samples": s["samples"] + self.done_before[s["rank"]]["samples"],
                 "steps": s["steps"] + self.done_before[s["rank"]]["steps"]} for s in out]

    def _retire(self, r: int) -> None:
        """Count a worker's work as done by its rank and forget the process."""
        try:
            self.taken[r] += ray.get(self.workers[r].taken_chunks.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        self.done_before[r] = {k: self.done_before[r][k] + self.last[r][k] for k in
                               ("samples", "steps")}
        self.last[r] = {"samples": 0, "steps": 0}
        ray.kill(self.workers[r], no_restart=True)
        ray.get(self.queue.release.remote(r))

    def recover_workers(self, dead: list[int]) -> str:
        """Bring the run back to N live workers; returns what was done, for the event log."""
        self.restarts += len(dead)
        if self.restarts > MAX_WORKER_RESTARTS:
            raise RunFailed(f"workers died {self.restarts} times; giving up (the last: "
                            f"{dead}). Check the worker logs for the cause.")
        if self.mode in HOGWILD_MODES:
            return self._recover_hogwild(dead)
        if self.mode in PS_DENSE_MODES and not self.cfg.switching.enabled:
            for r in dead:
                self._retire(r)
            self.start_workers(dead)
            return f"worker(s) {dead} died; restarted, their chunks requeued"
        if self.mode == "gba":  # the gloo group kept for switching must be formed anew
            for r in range(len(self.workers)):
                self._retire(r)
            self.start_workers(list(range(len(self.workers))))
            return (f"worker(s) {dead} died; every worker restarted on a new group (switching "
                    f"is on), chunks requeued")
        live = [r for r in range(len(self.workers)) if r not in dead]
        if not live:
            raise RunFailed("every worker died at once; the dense replicas are lost")
        # A live replica's dense state as of its current step and the one before; then no
        # worker is left to push, the PS forgets the incomplete step, and the step it completed
        # decides which state the new group starts from.
        states = ray.get(self.workers[live[0]].dense_states.remote(), timeout=30)
        for r in range(len(self.workers)):
            self._retire(r)
        ray.get([s.drop_pending.remote() for s in self.shards])
        # A worker that dies between its pushes to the shards leaves its last step complete on
        # some shards only. The group goes on after that step (the dense replicas took it);
        # the shards that missed it skip it, losing that step's row update.
        versions = [st["version"] for st in ray.get([s.stats.remote() for s in self.shards])]
        step = max(versions)
        if step not in states:
            raise RunFailed(f"cannot rebuild the sync group: the PS completed step {step}, "
                            f"worker {live[0]}'s replica knows steps {sorted(states)}")
        lagging = [i for i, v in enumerate(versions) if v < step]
        ray.get([self.shards[i].begin_sync.remote(step) for i in lagging])
        self.start_workers(list(range(len(self.workers))), states[step], step)
        return (f"worker(s) {dead} died; sync group rebuilt at step {step} from worker "
                f"{live[0]}'s replica, chunks requeued"
                + (f"; shard(s) {lagging} had not completed step {step - 1} and skip its row "
                   f"update" if lagging else ""))

    def _recover_hogwild(self, dead: list[int]) -> str:
        live = [r for r in range(len(self.workers)) if r not in dead]
        if not live:
            raise RunFailed("every worker died at once; the dense replicas are lost")
        params = ray.get(self.workers[live[0]].dense_vector.remote(), timeout=30)
        ranks = list(range(len(self.workers))) if _needs_group(self.cfg) else dead
        for r in ranks:
            self._retire(r)
        self.start_workers(ranks, {"params": params, "optimizer": None})
        return (f"worker(s) {dead} died; worker(s) {ranks} restarted from worker {live[0]}'s "
                f"dense replica (dense optimizer state reset), chunks requeued")

    def dead_shards(self) -> dict[int, str]:
        """{shard: why it is gone} for every shard that does not answer. With partial
        recovery a shard that Ray is restarting is given ``SHARD_RESTART_WAIT_S`` to return."""
        dead = {}
        patience = SHARD_RESTART_WAIT_S if self.cfg.recovery.kind == "partial" else 0.0
        for i, s in enumerate(self.shards):
            deadline = time.monotonic() + patience
            while True:
                try:
                    ray.get(s.stats.remote(), timeout=5)
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    if time.monotonic() >= deadline:
                        dead[i] = _death_cause(e)
                        break
                    time.sleep(0.5)
        return dead

    def switch(self, to: str) -> bool:
        """Pause every worker after a step, move the dense state, resume in mode ``to``.
        Returns False (and resumes in the same mode) if a worker finished meanwhile: the run
        is ending, and a sync group cannot be formed without it."""
        ray.get([w.request_pause.remote() for w in self.workers])
        states: list[str] = []
        deadline = time.time() + SWITCH_TIMEOUT_S
        while True:
            if time.time() > deadline:
                raise RunFailed(f"switching to {to}: the workers did not all pause within "
                                f"{SWITCH_TIMEOUT_S} s (states: {states})")
            states = [s["state"] for s in ray.get([w.status.remote() for w in self.workers],
                                                   timeout=60)]
            if "error" in states or "done" in states:
                ray.get([w.resume.remote(self.mode) for w in self.workers])
                return False
            if all(s == "paused" for s in states):
                break
            time.sleep(0.05)
        shard0 = self.shards[0]
        if to == "gba":
            dense = ray.get(self.workers[0].dense_handover.remote())
            t = self.cfg.train
            ray.get(shard0.install_dense.remote(dense["params"], t.dense_optimizer, t.dense_lr,
                                                dense["optimizer"]))
            ray.get([w.resume.remote("gba") for w in self.workers])
        else:
            ray.get([s.flush_gba.remote() for s in self.shards])  # no gradient left behind
            step = max(st["version"] for st in ray.get([s.stats.remote() for s in self.shards]))
            ray.get([s.begin_sync.remote(step) for s in self.shards])
            dense = ray.get(shard0.take_dense.remote())
            ray.get([w.resume.remote("sync", dense, step) for w in self.workers])
        self.mode = to
        return True

    def shard_restarts(self) -> list[tuple[int, dict, int]]:
        """Partial recovery: (shard, what it reloaded, the last version the driver saw it at
        before it died) for every shard that Ray restarted since the last call. A shard that is
        restarting right now is looked at again next time."""
        refs = [s.incarnation.remote() for s in self.shards]
        found = []
        for i, ref in enumerate(refs):
            try:
                inc = ray.get(ref, timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue
            before = self.shard_seen.get(i)
            if before is not None and before["pid"] != inc["pid"]:
                found.append((i, inc["restored"], before["version"]))
            self.shard_seen[i] = inc
        return found

    def checkpoint(self) -> dict:
        """A checkpoint of every shard now; returns each shard's sequence number and version
        (None for a shard that is restarting: partial recovery; it is skipped this time) and
        how long training was blocked (the slowest shard's snapshot: calls to it wait)."""
        refs = [s.checkpoint.remote() for s in self.shards]
        done = []
        for ref in refs:
            try:
                done.append(ray.get(ref, timeout=120))
            except ray.exceptions.RayActorError:
                if self.cfg.recovery.kind != "partial":
                    raise
                done.append(None)
        taken = [d for d in done if d is not None]
        return {"sequences": [d and d["sequence"] for d in done],
                "versions": [d and d["version"] for d in done],
                "blocked_s": max((d["blocked_s"] for d in taken), default=0.0)}

    def kill(self, target: str, index: int) -> None:
        (self.workers if target == "worker" else self.shards)[index].die.remote()

    # -- the end ---------------------------------------------------------------------------
    def finish(self) -> dict:
        t = self.cfg.train
        for r, w in enumerate(self.workers):
            self.taken[r] += ray.get(w.taken_chunks.remote())
        if self.mode == "gba":  # the last, partial global batch: nothing is left unapplied
            ray.get([s.flush_gba.remote() for s in self.shards])
        shard_stats = ray.get([s.stats.remote() for s in self.shards])
        written = ray.get([s.checkpoints_written.remote() for s in self.shards])
        shadow = eager = None
        if self.mode in HOGWILD_MODES:
            shadow = ray.get([w.shadow_stats.remote() for w in self.workers])
        if self.mode == "eager":
            eager = ray.get([w.eager_stats.remote() for w in self.workers])
        if _holds_center(self.cfg):  # EASGD's model is its center copy
            final_dense = ray.get(self.shards[0].easgd_center.remote())
        elif self.mode in ("sync", *HOGWILD_MODES):  # ma, bmuf: all replicas are alike now;
            # none: worker 0's own
            final_dense = ray.get(self.workers[0].dense_vector.remote())
        else:
            final_dense = ray.get(self.shards[0].pull.remote(
                [np.empty(0, np.int64)] * len(self.tables)))[1]
        with torch.no_grad():
            vector_to_parameters(torch.tensor(final_dense), list(self.dense_model.parameters()))
        model = LocalModel(self.dense_model, PSClient(self.shards, [tb.dim for tb in self.tables]),
                           None)
        final_eval = evaluate(model, self.ds, self.ds.rows("eval"), t.eval_batch_size)
        return {"eval": final_eval, "shards": shard_stats, "shadow": shadow, "eager": eager,
                "checkpoints_written": written, "checkpoint_dir": self.checkpoint_dir,
                "queue": ray.get(self.queue.summary.remote()), "taken": self.taken,
                "model": model}  # its lookup serves the trained rows while the session lasts


def run_distributed(cfg: RunConfig, ds: Dataset, log: MetricsLog, progress,
                    out_dir: Path | None = None) -> dict:
    """Train on Ray; returns what the summary needs beyond the local fields. Checkpoints, if
    any, go to ``recovery.dir`` or ``out_dir``/checkpoints."""
    run = DistributedRun(cfg, ds, progress,
                         None if out_dir is None else Path(out_dir) / "checkpoints")
    run.start = time.time()
    progress.train_start = time.perf_counter()
    progress.modes = [{"mode": cfg.mode, "from_s": progress.elapsed(), "to_s": None,
                       "cause": "config"}]
    if cfg.recovery.kind == "partial":
        run.shard_restarts()  # the shards' first processes, to tell a restart by
    run.start_workers(list(range(cfg.cluster.workers)))
    statuses = _watch(run, log)
    progress.train_end = time.perf_counter()
    return {**run.finish(), "statuses": statuses}


def _death_cause(e: Exception) -> str:
    """Why an actor is gone, in a few words: the error its constructor raised (its last line),
    or that its process died."""
    if isinstance(e, ray.exceptions.GetTimeoutError):
        return "does not answer (5 s)"
    text = str(e)
    if "creation task" in text:  # Ray: "...died because of an error raised in its creation task"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return f"failed to start: {lines[-1]}"
    return "died"


def _fault_schedule(cfg: RunConfig, horizon_s: float = 86_400.0) -> list[tuple[float, str, int]]:
    """(time_s, target, index) of every injected kill: the listed ones, and if kill_mean_s > 0
    seeded exponential inter-arrival times over random targets."""
    f = cfg.faults
    kills = [(k.at_s, k.target, k.index) for k in f.kills]
    if f.kill_mean_s > 0:
        rng = random.Random(f.seed)
        count = cfg.cluster.workers if f.kill_target == "worker" else cfg.cluster.ps_shards
        at = rng.expovariate(1 / f.kill_mean_s)
        while at < horizon_s and len(kills) < 10_000:
            kills.append((at, f.kill_target, rng.randrange(count)))
            at += rng.expovariate(1 / f.kill_mean_s)
    return sorted(kills)


def _watch(run: DistributedRun, log: MetricsLog) -> list[dict]:
    """Poll until every worker is done; write metrics; recover or raise RunFailed."""
    cfg, progress = run.cfg, run.progress
    t = cfg.train
    total = t.epochs * run.ds.rows("train")
    if t.max_steps:
        total = min(total, t.max_steps * t.batch_size * cfg.cluster.workers)
    bar = tqdm(total=total, unit="sample", unit_scale=True, desc=f"train ({cfg.mode})",
               disable=None if cfg.output.progress else True, smoothing=0.1)
    kills = _fault_schedule(cfg)
    every = cfg.recovery.checkpoint_every_s
    choosing = not every and cfg.recovery.mtbf_s > 0  # the first checkpoint measures the cost
    next_checkpoint = every if every else (0.0 if choosing else float("inf"))
    switches = list(cfg.switching.schedule)
    controller = ModeController(cfg.switching) if cfg.switching.auto else None
    last = time.perf_counter()
    try:
        while True:
            time.sleep(POLL_S)
            elapsed = time.time() - run.start
            if cfg.recovery.kind == "partial":  # (before the kills: the versions just
                # before an injected death are then known)
                for shard, restored, version in run.shard_restarts():
                    _log_partial_recovery(run, shard, restored, version, elapsed)
            while kills and kills[0][0] <= elapsed:
                _, target, index = kills.pop(0)
                run.kill(target, index)
                progress.events.append({"time_s": elapsed, "event": f"killed {target} {index}",
                                        "emulated": True})
            statuses = run.poll()
            dead = [s["rank"] for s in statuses if s["state"] == "dead"]
            errors = [s for s in statuses if s["state"] == "error"]
            if dead or errors:
                dead_shards = run.dead_shards()
                if dead_shards:
                    shard, cause = next(iter(dead_shards.items()))
                    if cfg.recovery.kind == "partial":
                        raise RunFailed(f"parameter-server shard {shard} {cause} and did not "
                                        f"come back from its checkpoint in time")
                    raise RunFailed(
                        f"parameter-server shard {shard} {cause}; the run stops here "
                        f"(recovery.kind = \"none\"; with recovery.kind = \"partial\" and "
                        f"recovery.checkpoint_every_s > 0 the shard restarts from its last "
                        f"checkpoint and the run goes on)")
                if errors and not dead:
                    raise RunFailed(f"worker {errors[0]['rank']} failed: {errors[0]['error']}")
                what = run.recover_workers(dead or [e["rank"] for e in errors])
                progress.events.append({"time_s": time.time() - run.start, "event": what})
                continue
            now = time.perf_counter()
            samples = sum(s["samples"] for s in statuses)
            bar.update(max(0, samples - progress.samples))
            loss_n = sum(s["loss_samples"] for s in statuses)
            record = {
                "time_s": progress.elapsed(), "samples": samples,
                "step": max(s["steps"] for s in statuses),
                "loss": sum(s["loss_sum"] for s in statuses) / loss_n if loss_n else None,
                "samples_per_s": (samples - progress.samples) / (now - last), "mode": run.mode,
                "worker_step_s": [s["step_s"] / s["interval_steps"] if s["interval_steps"]
                                  else None for s in statuses],
                "worker_compute_s": [s["compute_s"] / s["interval_steps"] if s["interval_steps"]
                                     else None for s in statuses],
                "staleness": None, "events": progress.events[progress.logged_events:],
                "eval": None}
            if cfg.mode == "eager":  # where a step's time went, per worker
                for key in ("pull_wait_s", "push_wait_s"):
                    record[f"worker_{key}"] = [s[key] / s["interval_steps"]
                                               if s["interval_steps"] else None
                                               for s in statuses]
                for key in ("step_s", "compute_s", "pull_wait_s", "push_wait_s",
                            "interval_steps"):
                    progress.split[key] = progress.split.get(key, 0) + sum(s[key]
                                                                           for s in statuses)
            progress.samples, progress.steps = samples, record["step"]
            progress.logged_events = len(progress.events)
            last = now
            log.write(record)
            if record["loss"] is not None:
                bar.set_postfix(loss=f"{record['loss']:.4f}")
            if all(s["state"] == "done" for s in statuses):
                return statuses
            if elapsed >= next_checkpoint and any(s["samples"] for s in statuses):
                ckpt = run.checkpoint()
                progress.checkpoints.append({"time_s": elapsed, "samples": progress.samples,
                                             **ckpt})
                progress.events.append({"time_s": elapsed, "event": (
                    f"checkpoint of the shards: sequence numbers {ckpt['sequences']}, versions "
                    f"{ckpt['versions']}, training blocked {ckpt['blocked_s'] * 1e3:.0f} ms")})
                if choosing:
                    every = _choose_interval(run, ckpt["blocked_s"], elapsed)
                    choosing = False
                next_checkpoint = elapsed + every
            decision = _due_switch(run, switches, controller, statuses, elapsed, record["step"])
            if decision and run.switch(decision[0]):
                _log_switch(run, *decision, elapsed)
                bar.set_description(f"train ({run.mode})")
                if controller:
                    controller.reset()
    finally:
        bar.close()


def _due_switch(run: DistributedRun, switches: list, controller: ModeController | None,
                statuses: list[dict], elapsed_s: float, step: int) -> tuple[str, str] | None:
    """(mode, cause) of a scheduled switch that is due, else the controller's decision."""
    while switches and ((0 <= switches[0].at_s <= elapsed_s)
                        or (0 <= switches[0].at_step <= step)):
        sw = switches.pop(0)
        if sw.to != run.mode:
            when = f"at_s = {sw.at_s:g}" if sw.at_s >= 0 else f"at_step = {sw.at_step}"
            return sw.to, f"schedule: switching.schedule says {sw.to} {when}"
    if controller is None:
        return None
    return controller.observe(elapsed_s, run.mode, [s["compute_s"] for s in statuses],
                              [s["interval_steps"] for s in statuses])


def _choose_interval(run: DistributedRun, save_cost_s: float, elapsed_s: float) -> float:
    """The checkpoint interval from the measured save cost and recovery.mtbf_s; the inputs
    and the decision go into the events and the summary."""
    r = run.cfg.recovery
    decision = choose(save_cost_s, r.mtbf_s, run.cfg.cluster.ps_shards, r.pls_target)
    text = decision.text()
    interval = decision.interval_s
    if decision.kind == "full":  # the run is configured for partial recovery
        interval = decision.partial_interval_s
        text += ("; full recovery is not built yet, so partial recovery goes on at its own "
                 f"interval ({interval:.1f} s)")
    run.progress.interval_decision = {**decision.as_dict(), "used_interval_s": interval}
    run.progress.events.append({"time_s": elapsed_s, "event": text})
    print(text, flush=True)
    return interval


def _log_partial_recovery(run: DistributedRun, shard: int, restored: dict, version: int,
                          elapsed_s: float) -> None:
    """A shard came back from its own last checkpoint: the updates it had applied since (from
    the checkpoint's version to the last version the driver saw, at most half a second before
    it died) are lost, each one batch of samples (gba: M batches): counted for PLS."""
    progress, cfg = run.progress, run.cfg
    per_update = cfg.train.batch_size * (
        (cfg.gba.gradients_per_update or cfg.cluster.workers) if cfg.mode == "gba" else 1)
    lost_updates = max(0, version - restored["version"])
    lost = lost_updates * per_update
    progress.recoveries.append({"time_s": elapsed_s, "shard": shard, "lost_updates": lost_updates,
                                "lost_samples": lost, "version_before": version, **restored})
    what = (f"checkpoint {restored['sequence']} (version {restored['version']})"
            if restored["sequence"] is not None else "nothing (no checkpoint yet: from scratch)")
    progress.events.append({"time_s": elapsed_s, "event": (
        f"partial recovery: shard {shard} restarted from {what}; its {lost_updates:,} updates "
        f"since (~{lost:,} samples) are lost")
        + (f"; skipped: {restored['skipped']}" if restored["skipped"] else "")})
    print(f"partial recovery: shard {shard} restarted from {what} at {elapsed_s:.1f} s",
          flush=True)


def _log_switch(run: DistributedRun, to: str, cause: str, elapsed_s: float) -> None:
    progress = run.progress
    at = progress.elapsed()
    frm = progress.modes[-1]["mode"]
    progress.modes[-1]["to_s"] = at
    progress.modes.append({"mode": to, "from_s": at, "to_s": None, "cause": cause})
    progress.events.append({"time_s": elapsed_s, "event": f"switched {frm} -> {to}",
                            "cause": cause})
    print(f"switched {frm} -> {to} at {elapsed_s:.1f} s of training: {cause}", flush=True)
