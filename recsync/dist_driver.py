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
  driver logs the recovery and counts the lost samples (PLS). With ``"full"`` Ray restarts it
  and the driver rolls everything back to the last job checkpoint: every shard, the data
  position, the counts and fresh workers (the work since is done again). Otherwise the run
  stops with an error naming the shard.

Checkpoint rounds (``recovery``): every shard writes its own checkpoint, and the driver a job
checkpoint naming them with the data position and, where the workers hold them, the dense
parameters (checkpoint/job.py). Sync pauses the workers after a step for it, so that replicas,
shards and data position agree. A round at the start and one at the end (the trained model)
make every run resumable: ``recsync train --resume DIR`` starts from the newest round.

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
from collections import deque
from pathlib import Path

import numpy as np
import ray
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from tqdm import tqdm

from recsync.checkpoint import files, job
from recsync.checkpoint.interval import choose
from recsync.checkpoint.priority import MostUsed, SampledRows
from recsync.checkpoint.writer import CheckpointWriter
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
from recsync.sync.handover import from_flat
from recsync.evaluate import evaluate
from recsync.local_run import LocalModel
from recsync.model.registry import table_rows_for
from recsync.worker.queue import WorkQueue
from recsync.worker.worker import Worker

POLL_S = 0.5
SWITCH_TIMEOUT_S = 120  # a worker pauses after its current step: minutes mean it is stuck
MAX_WORKER_RESTARTS = 20  # per run: a crash loop must end in an error, not go on forever
MAX_SHARD_RESTARTS = 20  # per shard, with full or partial recovery
SHARD_RESTART_WAIT_S = 60  # recovery: how long a restarting shard may take to answer
# A shard that dies loses at most two checkpoints not yet on disk (one being written, one
# waiting: writer.py), which the newest job checkpoints may name: keep two more of those.
JOB_KEEP_EXTRA = 2
RATE_WINDOW_POLLS = 20  # the training rate that prices work done again: over the last 10 s


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
    r = cfg.recovery
    core = ShardCore(tables, make_row_optimizer(t.embedding_optimizer, t.embedding_lr),
                     shard=shard, num_shards=cfg.cluster.ps_shards,
                     num_workers=cfg.cluster.workers, seed=t.seed,
                     init_scale=cfg.model.embedding_init_scale, dense=dense,
                     gba_gradients=cfg.gba.gradients_per_update,
                     decay=StalenessDecay(cfg.gba.staleness_threshold, cfg.gba.decay),
                     center=center, full_every=r.full_every)
    if r.rows == "mfu":
        core.priority = MostUsed([len(w) for w in core.store.weights], r.mfu_fraction)
    elif r.rows == "ssu":
        core.priority = SampledRows(len(tables), r.ssu_max_rows)
    return core


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
        restarts = MAX_SHARD_RESTARTS if cfg.recovery.kind != "none" else 0
        # The shards' constructor arguments, held here: Ray needs them again to restart a
        # shard, and drops a large one (shard 0's dense parameters) once nothing refers to it.
        self._builders = [ray.put(functools.partial(_make_core, self.tables, cfg, s,
                                                    dense_init if s == 0 else None))
                          for s in range(c.ps_shards)]
        self.shards = [PSShard.options(max_restarts=restarts).remote(
            self._builders[s], network,
            None if self.checkpoint_dir is None else str(job.shard_dir(self.checkpoint_dir, s)),
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
        self.shard_seen: dict[int, dict] = {}  # recovery on: each shard's last incarnation
        self.killed_at: dict[int, float] = {}  # shard -> epoch seconds of an injected kill
        self.recovery_kind = "partial" if cfg.recovery.kind == "auto" else cfg.recovery.kind
        self.resumed_unix = 0.0  # when the last full-recovery rollback had workers going again
        self.recent: deque = deque(maxlen=RATE_WINDOW_POLLS)  # (epoch s, samples) per poll
        self.job_rounds: deque = deque(maxlen=cfg.recovery.keep + JOB_KEEP_EXTRA)  # their
        # shards' sequence numbers, oldest first: the shards keep those checkpoints
        self.job_writer = (None if self.checkpoint_dir is None else
                           CheckpointWriter(job.job_dir(self.checkpoint_dir),
                                            keep=cfg.recovery.keep + JOB_KEEP_EXTRA))

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
        patience = SHARD_RESTART_WAIT_S if self.cfg.recovery.kind != "none" else 0.0
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
        if not self._pause_all(f"switching to {to}"):
            return False
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

    def _pause_all(self, why: str) -> bool:
        """Ask every worker to pause after a step and wait until all have. Returns False (and
        lets them go on) if a worker finished meanwhile: the run is ending."""
        ray.get([w.request_pause.remote() for w in self.workers])
        states: list[str] = []
        deadline = time.time() + SWITCH_TIMEOUT_S
        while True:
            if time.time() > deadline:
                raise RunFailed(f"{why}: the workers did not all pause within "
                                f"{SWITCH_TIMEOUT_S} s (states: {states})")
            states = [s["state"] for s in ray.get([w.status.remote() for w in self.workers],
                                                   timeout=60)]
            if ("error" in states or "done" in states
                    or (self.cfg.recovery.kind != "none" and self._shard_changed())):
                ray.get([w.resume.remote(self.mode) for w in self.workers])
                return False
            if all(s == "paused" for s in states):
                return True
            time.sleep(0.05)

    def _shard_changed(self) -> bool:
        """Whether a shard is dead or restarting, or restarted since the driver last looked
        (then workers waiting for it cannot pause; the recovery comes first)."""
        refs = [s.incarnation.remote() for s in self.shards]
        try:
            pids = [inc["pid"] for inc in ray.get(refs, timeout=1.0)]
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return True
        return any(i in self.shard_seen and pid != self.shard_seen[i]["pid"]
                   for i, pid in enumerate(pids))

    def shard_restarts(self) -> list[tuple[int, dict, int]]:
        """Recovery on: (shard, what it reloaded, the last version the driver saw it at before
        it died) for every shard that Ray restarted since the last call. A shard that is
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

    def checkpoint(self, final: bool = False) -> dict | None:
        """A checkpoint round: every shard's own checkpoint and, if every shard took one, a job
        checkpoint naming them. Sync pauses the workers after a step first (None if it cannot:
        a worker finished); other modes do not pause, and a chunk leased at that moment is
        trained again from its start after a rollback. ``final``: the workers are done.

        Returns each shard's sequence number and version (None for a shard that is restarting
        with recovery on: it is skipped this time), the job checkpoint's sequence, and how
        long training was blocked: sync, the pause; else the slowest shard's snapshot (calls to
        it wait)."""
        begin = time.perf_counter()
        paused = self.mode == "sync" and not final and self.workers[0] is not None
        if paused and not self._pause_all("checkpoint"):
            return None
        try:
            started = self.workers[0] is not None
            positions = {}
            if paused:
                for p in ray.get([w.positions.remote() for w in self.workers]):
                    positions.update(p)
            counts = (self.poll() if started
                      else [{"samples": 0, "steps": 0} for _ in self.workers])
            # the data position before the shards' state: what completes in between is
            # trained again after a rollback, never skipped
            queue_state = ray.get(self.queue.state.remote(positions))
            if not paused:  # leased chunks start again: only completed ones are done
                completed = queue_state["by_worker"]
                batch = self.cfg.train.batch_size
                counts = [{"samples": completed.get(str(r), {}).get("samples", 0),
                           "steps": c["steps"] - round((c["samples"] - completed.get(
                               str(r), {}).get("samples", 0)) / batch)}
                          for r, c in enumerate(counts)]
            # keep what the job checkpoints kept after this round name (this one drops the
            # oldest once the driver keeps as many as it may)
            named = list(self.job_rounds)[1 - self.job_rounds.maxlen:]
            floor = [min(r[i] for r in named) if named else None
                     for i in range(len(self.shards))]
            refs = [s.checkpoint.remote(floor[i]) for i, s in enumerate(self.shards)]
            done = []
            for ref in refs:
                try:
                    done.append(ray.get(ref, timeout=120))
                except ray.exceptions.RayActorError:
                    if self.cfg.recovery.kind == "none":
                        raise
                    done.append(None)
            dense = self._dense_for_job(final)
        finally:
            if paused:
                ray.get([w.resume.remote(self.mode) for w in self.workers])
        taken = [d for d in done if d is not None]
        sequences = [d and d["sequence"] for d in done]
        # A shard that Ray restarted since the driver last looked answers too (calls wait for
        # the restart), with the state it reloaded: such a round mixes old and new states, so
        # it makes no job checkpoint (full recovery rolls back to the one before).
        restarted = [i for i, d in enumerate(done) if d is not None and i in self.shard_seen
                     and d["pid"] != self.shard_seen[i]["pid"]]
        job_sequence = None
        if len(taken) == len(done) and not restarted:
            self.job_rounds.append(sequences)
            job_sequence = self.job_writer.save(job.dense_arrays(dense), {
                "final": final, "mode": self.mode, "shard_sequences": sequences,
                "step_index": max(d["version"] for d in done) if self.mode == "sync" else 0,
                "queue": queue_state, "unix": time.time(),
                "done": [{"samples": c["samples"], "steps": c["steps"]} for c in counts],
                "samples": sum(c["samples"] for c in counts),
                "steps": max(c["steps"] for c in counts),
                "train_s": time.time() - self.start, "dense_param_groups": job.dense_meta(dense)})
        blocked = (time.perf_counter() - begin if paused
                   else max((d["blocked_s"] for d in taken), default=0.0))
        return {"sequences": sequences, "versions": [d and d["version"] for d in done],
                "job_sequence": job_sequence, "blocked_s": blocked,
                "partial": [d and d["partial"] for d in done],
                "rows": [d and d["rows"] for d in done]}

    def _dense_for_job(self, final: bool) -> dict | None:
        """The dense state a job checkpoint holds where the workers hold it: sync, a replica's
        parameters and optimizer state (the PS's flat layout); shadow and foreground, worker
        0's parameters (a restart starts their optimizers afresh). PS modes: None (shard 0's
        checkpoint has them)."""
        if self.workers[0] is None:  # the round before the workers start: the initial model
            if self.mode in PS_DENSE_MODES:
                return None
            return {"params": parameters_to_vector(self.dense_model.parameters())
                    .detach().numpy().copy(), "optimizer": None}
        if self.mode == "sync":
            return ray.get(self.workers[0].dense_handover.remote(), timeout=60)
        if self.mode in HOGWILD_MODES:
            return {"params": ray.get(self.workers[0].dense_vector.remote(), timeout=60),
                    "optimizer": None}
        return None

    def rollback(self, ckpt: files.Checkpoint) -> dict:
        """Full recovery and resume: every shard back to its checkpoint of job checkpoint
        ``ckpt``, the data position and the counts too, and fresh workers from its dense
        state. Returns the shards' versions and the slowest load."""
        for w in self.workers:
            if w is not None:
                ray.kill(w, no_restart=True)
        meta = ckpt.meta
        loaded = ray.get([s.rollback.remote(seq) for s, seq in
                          zip(self.shards, meta["shard_sequences"])], timeout=300)
        ray.get(self.queue.restore.remote(meta["queue"]))
        self.done_before = [dict(d) for d in meta["done"]]
        self.last = [{"samples": 0, "steps": 0} for _ in self.workers]
        dense = job.dense_state(ckpt)
        if dense is not None and dense["optimizer"] is not None:
            dense["optimizer"] = from_flat(dense["optimizer"],
                                           [p.shape for p in self.dense_model.parameters()])
        self.workers = [None] * len(self.workers)
        self.start_workers(list(range(len(self.workers))), dense, meta["step_index"])
        return {"versions": [x["version"] for x in loaded],
                "load_s": max(x["load_s"] for x in loaded)}

    def kill(self, target: str, index: int) -> None:
        if target != "worker":
            self.killed_at[index] = time.time()
        (self.workers if target == "worker" else self.shards)[index].die.remote()

    # -- the end ---------------------------------------------------------------------------
    def finish(self) -> dict:
        t = self.cfg.train
        for r, w in enumerate(self.workers):
            self.taken[r] += ray.get(w.taken_chunks.remote())
        if self.mode == "gba":  # the last, partial global batch: nothing is left unapplied
            ray.get([s.flush_gba.remote() for s in self.shards])
        final_checkpoint = None
        if self.checkpoint_dir is not None:  # the trained model, and a run that can be resumed
            final_checkpoint = self.checkpoint(final=True)
            self.job_writer.close()
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
        final_eval = evaluate(model.dense, model.lookup, self.ds, self.ds.rows("eval"), t.eval_batch_size)
        return {"eval": final_eval, "shards": shard_stats, "shadow": shadow, "eager": eager,
                "checkpoints_written": written, "checkpoint_dir": self.checkpoint_dir,
                "final_checkpoint": final_checkpoint,
                "queue": ray.get(self.queue.summary.remote()), "taken": self.taken,
                "model": model}  # its lookup serves the trained rows while the session lasts


def run_distributed(cfg: RunConfig, ds: Dataset, log: MetricsLog, progress,
                    out_dir: Path | None = None, resume: files.Checkpoint | None = None) -> dict:
    """Train on Ray; returns what the summary needs beyond the local fields. Checkpoints, if
    any, go to ``recovery.dir`` or ``out_dir``/checkpoints. ``resume``: a job checkpoint of
    an earlier run of this config to go on from."""
    run = DistributedRun(cfg, ds, progress,
                         None if out_dir is None else Path(out_dir) / "checkpoints")
    run.start = time.time() - (resume.meta["train_s"] if resume else 0.0)
    progress.train_start = time.perf_counter()
    progress.modes = [{"mode": cfg.mode, "from_s": progress.elapsed(), "to_s": None,
                       "cause": "config"}]
    if cfg.recovery.kind != "none":
        run.shard_restarts()  # the shards' first processes, to tell a restart by
    if resume is not None:
        loaded = run.rollback(resume)
        progress.samples, progress.steps = resume.meta["samples"], resume.meta["steps"]
        progress.train_s_before = resume.meta["train_s"]
        text = (f"resumed from job checkpoint {resume.sequence} of {run.checkpoint_dir}: "
                f"{progress.samples:,} samples done, shards at versions {loaded['versions']}"
                + (f"; skipped newer: {resume.skipped}" if resume.skipped else ""))
        progress.events.append({"time_s": time.time() - run.start, "event": text})
        print(text, flush=True)
    else:
        if run.checkpoint_dir is not None:  # round 0: a rollback or resume before the first
            _record_checkpoint(run, run.checkpoint(), 0.0, training=False)
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
            if cfg.recovery.kind != "none":  # (before the kills: the versions just
                # before an injected death are then known)
                for shard, restored, version in run.shard_restarts():
                    if run.recovery_kind == "partial":
                        _log_partial_recovery(run, shard, restored, version, elapsed)
                    else:
                        _full_recovery(run, shard, elapsed)
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
                    if cfg.recovery.kind != "none":
                        raise RunFailed(f"parameter-server shard {shard} {cause} and did not "
                                        f"come back from its checkpoint in time")
                    raise RunFailed(
                        f"parameter-server shard {shard} {cause}; the run stops here "
                        f"(recovery.kind = \"none\"; with recovery.kind = \"partial\" or "
                        f"\"full\" and recovery.checkpoint_every_s > 0 the run goes on from "
                        f"checkpoints)")
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
            run.recent.append((time.time(), samples))
            progress.logged_events = len(progress.events)
            last = now
            log.write(record)
            if record["loss"] is not None:
                bar.set_postfix(loss=f"{record['loss']:.4f}")
            if all(s["state"] == "done" for s in statuses):
                return statuses
            if elapsed >= next_checkpoint and any(s["samples"] for s in statuses):
                ckpt = run.checkpoint()
                if ckpt is not None:
                    _record_checkpoint(run, ckpt, elapsed)
                    if choosing:
                        every = _choose_interval(run, ckpt, elapsed)
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


def _record_checkpoint(run: DistributedRun, ckpt: dict, elapsed_s: float,
                       training: bool = True) -> None:
    """Log a checkpoint round; ``training``: whether workers were training (else it blocked
    nothing: the round before they start)."""
    progress = run.progress
    if not training:
        ckpt = {**ckpt, "blocked_s": 0.0}
    progress.checkpoints.append({"time_s": elapsed_s, "samples": progress.samples, **ckpt})
    partial = [i for i, x in enumerate(ckpt["partial"]) if x]
    progress.events.append({"time_s": elapsed_s, "event": (
        f"checkpoint: shards' sequence numbers {ckpt['sequences']}"
        + (f" (partial: shard(s) {partial})" if partial else "")
        + f", versions {ckpt['versions']}, job checkpoint {ckpt['job_sequence']}, training "
        f"blocked {ckpt['blocked_s'] * 1e3:.0f} ms")})


def _choose_interval(run: DistributedRun, ckpt: dict, elapsed_s: float) -> float:
    """The checkpoint interval from the measured save cost and recovery.mtbf_s; the inputs
    and the decision go into the events and the summary. The save cost is what the round
    ``ckpt`` blocked training; its write to disk (waited for here, once, and added to the
    round's blocked time: the shards wait meanwhile) bounds the interval from below, as a
    writer slower than the interval would block every save."""
    r = run.cfg.recovery
    begin = time.perf_counter()
    write_s = 0.0
    for ref in [s.checkpoints_written.remote() for s in run.shards]:
        try:
            written = ray.get(ref, timeout=300)
        except ray.exceptions.RayActorError:  # restarting (recovery on)
            continue
        write_s = max([write_s] + [w["write_s"] for w in written[-1:]])
    run.progress.checkpoints[-1]["blocked_s"] += time.perf_counter() - begin
    decision = choose(ckpt["blocked_s"], r.mtbf_s, run.cfg.cluster.ps_shards, r.pls_target)
    text = decision.text()
    if r.kind == "auto":
        run.recovery_kind = decision.kind
    used = run.recovery_kind
    interval = decision.full_interval_s if used == "full" else decision.partial_interval_s
    if used != decision.kind:
        text += (f"; recovery.kind = \"{r.kind}\" is configured, so {used} recovery goes on "
                 f"at its own interval ({interval:.1f} s)")
    if interval < write_s:
        interval = write_s
        text += f"; the interval is raised to the measured write time {write_s:.2f} s"
    run.progress.interval_decision = {**decision.as_dict(), "used_kind": used,
                                      "used_interval_s": interval, "write_s": write_s}
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
    ready = run.shard_seen[shard]["ready_unix"]
    killed = run.killed_at.pop(shard, ready)
    progress.recoveries.append({"kind": "partial", "time_s": elapsed_s, "shard": shard,
                                "lost_updates": lost_updates, "lost_samples": lost,
                                "version_before": version, "downtime_s": max(0.0, ready - killed),
                                "lost_work_s": 0.0, **restored})
    what = (f"checkpoint {restored['sequence']} (version {restored['version']})"
            if restored["sequence"] is not None else "nothing (no checkpoint yet: from scratch)")
    progress.events.append({"time_s": elapsed_s, "event": (
        f"partial recovery: shard {shard} restarted from {what}; its {lost_updates:,} updates "
        f"since (~{lost:,} samples) are lost")
        + (f"; skipped: {restored['skipped']}" if restored["skipped"] else "")})
    print(f"partial recovery: shard {shard} restarted from {what} at {elapsed_s:.1f} s",
          flush=True)


def _full_recovery(run: DistributedRun, shard: int, elapsed_s: float) -> None:
    """A shard came back (Ray restarted it): roll every shard, the data position and the
    workers back to the newest job checkpoint that loads whole. The work since (from the later
    of that checkpoint and the previous rollback to the failure) is done again."""
    progress = run.progress
    run.job_writer.flush()
    ckpt, skipped = job.restorable(run.checkpoint_dir)
    if ckpt is None:
        raise RunFailed(f"full recovery after shard {shard} died: no complete job checkpoint in "
                        f"{run.checkpoint_dir}" + (f" ({'; '.join(skipped)})" if skipped else ""))
    now = time.time()
    killed = run.killed_at.pop(shard, now)
    redone = max(0, progress.samples - ckpt.meta["samples"])
    # the work done again, priced at the training rate before the failure (the samples of a
    # chunk that was leased at the checkpoint are redone too: more than the time since it)
    before = [(t, n) for t, n in run.recent if t <= killed]
    rate = ((before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
            if len(before) >= 2 and before[-1][0] > before[0][0] else 0.0)
    lost_work_s = (redone / rate if rate > 0
                   else max(0.0, killed - max(ckpt.meta["unix"], run.resumed_unix)))
    loaded = run.rollback(ckpt)
    run.resumed_unix = time.time()
    run.recent.clear()
    progress.samples, progress.steps = ckpt.meta["samples"], ckpt.meta["steps"]
    progress.recoveries.append({
        "kind": "full", "time_s": elapsed_s, "shard": shard, "job_sequence": ckpt.sequence,
        "samples_redone": redone, "lost_samples": 0, "lost_work_s": lost_work_s,
        "downtime_s": run.resumed_unix - killed, "load_s": loaded["load_s"],
        "skipped": skipped})
    progress.events.append({"time_s": elapsed_s, "event": (
        f"full recovery: shard {shard} restarted; every shard, the data position and the "
        f"workers rolled back to job checkpoint {ckpt.sequence} ({ckpt.meta['samples']:,} "
        f"samples); ~{redone:,} samples ({lost_work_s:.1f} s of training at the rate before) "
        f"to do again, "
        f"{run.resumed_unix - killed:.1f} s without training")
        + (f"; skipped newer: {skipped}" if skipped else "")})
    print(f"full recovery: shard {shard} restarted; rolled back to job checkpoint "
          f"{ckpt.sequence} at {elapsed_s:.1f} s", flush=True)


def _log_switch(run: DistributedRun, to: str, cause: str, elapsed_s: float) -> None:
    progress = run.progress
    at = progress.elapsed()
    frm = progress.modes[-1]["mode"]
    progress.modes[-1]["to_s"] = at
    progress.modes.append({"mode": to, "from_s": at, "to_s": None, "cause": cause})
    progress.events.append({"time_s": elapsed_s, "event": f"switched {frm} -> {to}",
                            "cause": cause})
    print(f"switched {frm} -> {to} at {elapsed_s:.1f} s of training: {cause}", flush=True)
