"""Modes "shadow" and "foreground" (ShadowSync, docs/design.md §6.4): each worker trains its own
dense replica with ``shadow.hogwild_threads`` Hogwild threads (each with its own PS client and
chunk lease; embedding rows are trained on the PS as in async), and the replicas are kept in
step by ``shadow.algorithm``: in a background thread (shadow) or every
``shadow.foreground_every`` iterations inside training (foreground).

- replica.py: the dense replica and one thread's step on it;
- rules.py: the update rules of EASGD, MA and BMUF as plain tensor arithmetic;
- synchronizers.py: one round of each (and EASGD's center copy on PS shard 0);
- hogwild.py: the threads and when rounds run.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading

import torch

from recsync.metrics.stats import distribution, merged_counts
from recsync.model.optim import DENSE_OPTIMIZERS
from recsync.modes.async_ps import ApplyNow
from recsync.modes.base import (FROM_REPLICA, JOIN_FROM_REPLICA, JOIN_REPLICA_GROUP, Mode,
                                WorkerMode)
from recsync.modes.shadow.hogwild import HogwildTrainer
from recsync.modes.shadow.replica import DenseReplica, HogwildStep
from recsync.modes.shadow.rules import BMUF
from recsync.modes.shadow.synchronizers import AveragingSync, CenterCopy, ElasticSync

SHADOW_TIMEOUT_S = 300  # a round waits this long for the other trainers before failing


def averaging_group():
    """(A gloo group of every process of the group this process is in, their number): MA's
    and BMUF's rounds."""
    import torch.distributed as dist
    group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=SHADOW_TIMEOUT_S))
    return group, dist.get_world_size(group)


class ShadowWorker(WorkerMode):
    background = True  # rounds in a thread of their own (foreground: inside training)

    def __init__(self, ctx):
        super().__init__(ctx)
        sh, t = ctx.cfg.shadow, ctx.cfg.train
        self.replica = DenseReplica(ctx.model, DENSE_OPTIMIZERS[t.dense_optimizer], t.dense_lr,
                                    t.dense_weight_decay, t.dense_warmup_steps)
        if ctx.dense_state is not None:  # a restart from a live replica's parameters
            self.replica.load(torch.tensor(ctx.dense_state["params"]))  # a copy
        self.threads = sh.hogwild_threads
        self.steps = [HogwildStep(self.replica, ctx.client if i == 0 else ctx.new_client(),
                                  ctx.after_compute, ctx.before_compute)
                      for i in range(self.threads)]
        self.trainer: HogwildTrainer | None = None
        self.sync: AveragingSync | None = None  # MA, BMUF: made when training starts
        self._rounds_lock = threading.Lock()
        self._pause_asked = False  # a formation asked for a pause before the rounds began
        self._bmuf_state = (ctx.dense_state or {}).get("bmuf")

    def step(self, batch, ahead=None, thread: int = 0):
        return self.steps[thread].step(batch)

    def finish(self, thread: int = 0) -> None:
        self.steps[thread].finish()

    def run(self, steps) -> None:
        sh = self.ctx.cfg.shadow
        self.trainer = HogwildTrainer(steps, self.make_synchronizer(), background=self.background,
                                      every=sh.foreground_every,
                                      min_interval_s=sh.min_interval_s,
                                      paced=functools.partial(self.ctx.paced,
                                                              background=self.background))
        self.trainer.run()

    def make_synchronizer(self, sim_group=None, get=None):
        """The rounds' synchronizer (None: algorithm none). MA and BMUF all-reduce over a gloo
        group made here, or over ``sim_group`` (the simulator's: simulation/rounds.py); EASGD
        waits for shard 0's answer with ``get`` (None: ray.get)."""
        cfg = self.ctx.cfg
        sh, trainers = cfg.shadow, cfg.cluster.workers
        if sh.algorithm == "none":
            return None
        if sh.algorithm == "easgd":
            return ElasticSync(self.replica, self.ctx.shards, sh.alpha(trainers),
                               survive_shard_restarts=cfg.recovery.kind != "none", get=get)
        bmuf = None
        if sh.algorithm == "bmuf":
            bmuf = BMUF(self.replica.vector(), sh.momentum(trainers), sh.bmuf_lr,
                        sh.bmuf_nesterov)
            if self._bmuf_state is not None:  # a trainer joining: the group's block state
                bmuf.load(self._bmuf_state)
        if sim_group is None:
            group, trainers = averaging_group()
            all_reduce = None
        else:
            group, trainers, all_reduce = None, sim_group.size, sim_group.all_reduce
        with self._rounds_lock:
            self.sync = AveragingSync(self.replica, group, trainers, bmuf, all_reduce)
            if self._pause_asked:
                self.sync.request_pause()
        return self.sync

    def rounds(self, verb: str | None = None) -> dict:
        """An elastic run's formations of the averaging group (distributed/regroup_rounds.py):
        ``verb`` "pause" (after the next round), "regroup" (go on in the group this process
        joined since; the rounds' own group is made here, with every member's), "resume" (in
        the same group) or "leave" (no more rounds); then where the rounds stand:
        {"paused_after": the round every trainer paused after, or None; "drained": whether
        this trainer's training threads are all done}."""
        if verb not in (None, "pause", "regroup", "resume", "leave"):
            raise ValueError(f"rounds: unknown verb {verb!r}")
        group = averaging_group() if verb == "regroup" else (None, 0)
        with self._rounds_lock:
            sync = self.sync
            if verb is not None:  # a pause asked before the rounds began holds till then
                self._pause_asked = verb == "pause"
            if sync is not None and verb == "pause":
                sync.request_pause()
            elif sync is not None and verb == "leave":
                sync.leave()
            elif sync is not None and verb in ("regroup", "resume"):
                sync.regroup(*group)
        h = self.trainer
        return {"paused_after": None if sync is None else sync.paused_after,
                "drained": h is not None and h.training_over()}

    def dense_state(self) -> dict:
        """The replica's parameters (a restart starts its optimizer afresh), and BMUF's block
        state (a trainer joining an elastic run takes the group's)."""
        return {"params": self.replica.vector().numpy(), "optimizer": None,
                "bmuf": None if self.sync is None else self.sync.bmuf_state()}

    def stats(self) -> dict:
        """This trainer's sync rounds (hogwild.py)."""
        h = self.trainer
        if h is None:
            raise RuntimeError(f"worker {self.ctx.rank} has not started training")
        return {"rounds": h.stats.rounds, "final_rounds": h.stats.final_rounds,
                "round_s": h.stats.round_s, "gaps": dict(h.stats.gaps),
                "iterations": h.iterations, "train_s": h.train_s(),
                "threads_alive": h.threads_alive()}


class ForegroundWorker(ShadowWorker):
    background = False


class Shadow(Mode):
    name = "shadow"
    joins = JOIN_FROM_REPLICA
    worker = ShadowWorker
    worker_death = FROM_REPLICA
    summary_key = "shadow"
    shadow_thread = True

    @classmethod
    def needs_group(cls, cfg) -> bool:
        return cfg.shadow.algorithm in ("ma", "bmuf")

    @classmethod
    def elastic_join(cls, cfg) -> str | None:
        """From a live replica; with MA or BMUF, the averaging group is formed again too."""
        return JOIN_REPLICA_GROUP if cls.needs_group(cfg) else JOIN_FROM_REPLICA

    @classmethod
    def not_simulated(cls, cfg) -> str | None:
        """The simulator runs one training thread per trainer (simulation/rounds.py)."""
        if cfg.shadow.hogwild_threads > 1:
            return "shadow.hogwild_threads > 1 (one training thread per trainer)"
        return None

    @classmethod
    def quiet_when_paused(cls, cfg) -> bool:
        """Not with Hogwild threads (a worker pauses when one of them does), with background
        EASGD rounds (their exchanges with shard 0 go on), nor with rounds inside training
        that wait for every trainer (foreground MA, BMUF: a paused one would never come)."""
        sh = cfg.shadow
        if not cls.shadow_thread and cls.needs_group(cfg):
            return False
        return sh.hogwild_threads == 1 and not (cls.shadow_thread and sh.algorithm == "easgd")

    @classmethod
    def make_rule(cls, cfg, shard, dense_init):
        if shard == 0 and cfg.shadow.algorithm == "easgd":
            return CenterCopy(dense_init)
        return ApplyNow()

    @classmethod
    def summary(cls, cfg, workers, shards, waits) -> dict | None:
        """How often the replicas were synchronized while training. ``sync_gap``: a trainer's
        training iterations (all its threads') between two syncs."""
        if not workers:
            return None
        sh, background = cfg.shadow, cls.worker.background
        gaps = merged_counts(w["gaps"] for w in workers)
        rounds = sum(w["rounds"] + w["final_rounds"] for w in workers)
        return {
            "algorithm": sh.algorithm, "background": background,
            "hogwild_threads": sh.hogwild_threads,
            "min_interval_s": sh.min_interval_s if background else None,
            "foreground_every": None if background else sh.foreground_every,
            "syncs": [w["rounds"] for w in workers],
            "syncs_per_s": [w["rounds"] / w["train_s"] if w["train_s"] > 0 else None
                            for w in workers],
            "final_syncs": [w["final_rounds"] for w in workers],
            "sync_gap": distribution(gaps),
            "sync_s_mean": (sum(w["round_s"] for w in workers) / rounds) if rounds else None,
            "threads_left_running": sum(w["threads_alive"] for w in workers),
        }


    @classmethod
    def console_line(cls, sh: dict) -> str | None:
        if sh["algorithm"] == "none":
            return None
        rates = [r for r in sh["syncs_per_s"] if r is not None]
        gap = sh["sync_gap"]
        return (f"{'background' if sh['background'] else 'foreground'} {sh['algorithm']}: "
                f"{sum(rates) / max(len(rates), 1):.1f} syncs/s per worker, sync gap "
                + (f"{gap['mean']:.2f} iterations (p99 {gap['p99']})" if gap["mean"] is not None
                   else "n/a"))


class Foreground(Shadow):
    name = "foreground"
    worker = ForegroundWorker
    shadow_thread = False  # its rounds run in the training loop
