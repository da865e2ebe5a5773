"""What can go wrong and what a run does about it: the emulated network, recovery from failed
PS shards, and injected faults (stragglers, kills)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from recsync.config.base import Section


class NetworkConfig(Section):
    """EMULATED network delay on every call to a PS shard (pull, push), for experiments; every
    report of a run with it says so."""

    latency_ms: float = Field(0.0, ge=0)
    """added to each call, half on the way there and half on the way back"""
    ms_per_mb: float = Field(0.0, ge=0)
    """added per MB a call carries (request and answer), e.g. 8 for 1 Gbit/s"""

    @property
    def enabled(self) -> bool:
        return self.latency_ms > 0 or self.ms_per_mb > 0


class RecoveryConfig(Section):
    kind: Literal["none", "full", "partial", "auto"] = "none"
    """what a PS shard's death does: "none" stops the run with an error; "full" rolls every
    shard, the workers and the data position back to the last checkpoint of the job (the
    classic recovery: the work since is done again); "partial" restarts the shard alone from
    its own last checkpoint while the other shards and the workers go on (the updates it
    applied since are lost, counted in summary recovery.pls; not with the modes whose shards
    move in lock-step, sync and hybrid); "auto" chooses between the two at run time from
    mtbf_s and the first checkpoint's measured cost (partial only if its expected overhead is
    lower; logged). All need checkpoint_every_s or mtbf_s"""
    rows: Literal["all", "mfu", "ssu"] = "all"
    """what a partial-recovery checkpoint saves (CPR): "all" every row touched; "mfu" the
    mfu_fraction most used rows since their last save, with a full save every full_every
    checkpoints; "ssu" the rows touched by a sub-sample (ssu_rate) of the training samples,
    at most ssu_max_rows per shard between saves, with a full save every full_every"""
    mfu_fraction: float = Field(0.1, gt=0, le=1)
    """rows = "mfu": the share of the rows used since their last save that a checkpoint saves"""
    ssu_rate: float = Field(0.02, gt=0, le=1)
    """rows = "ssu": the share of training samples whose rows are recorded"""
    ssu_max_rows: int = Field(100_000, ge=1)
    """rows = "ssu": at most this many rows recorded per shard between saves (bounded memory;
    further rows wait for the next full save)"""
    full_every: int = Field(4, ge=1)
    """rows = "mfu" or "ssu": every this many checkpoints is a full one (the base the
    partial ones after it apply to)"""
    checkpoint_every_s: float = Field(0.0, ge=0)
    """write a checkpoint of every PS shard this often, in seconds of training (0: never, or
    chosen from mtbf_s). A shard blocks only while it copies its state; a thread of its own
    writes it"""
    mtbf_s: float = Field(0.0, ge=0)
    """mean time between failures, for choosing the interval when checkpoint_every_s is 0:
    the first checkpoint measures the save cost; full recovery then uses Young's interval
    sqrt(2 x cost x MTBF), partial recovery the longest interval whose expected portion of
    lost samples stays under pls_target (recsync/checkpoint/interval.py); the inputs and the
    decision are logged"""
    pls_target: float = Field(0.01, gt=0, lt=1)
    """partial recovery: the expected portion of lost samples the interval may cost"""
    keep: int = Field(2, ge=1)
    """checkpoints kept per shard (older ones are deleted once a newer one is complete)"""
    dir: str = ""
    """where checkpoints go (empty: the run's --out directory/checkpoints); on a cluster, a
    directory every node can write to"""


class StragglerConfig(Section):
    worker: int = Field(ge=0)
    factor: float = Field(ge=1.0)
    """the worker runs this many times slower: between computing a step's gradients and sending
    them it sleeps (factor - 1) x the compute time, so its gradients arrive late and stale"""
    start_s: float = Field(0.0, ge=0)
    end_s: float = float("inf")

    @model_validator(mode="after")
    def _check_window(self):
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be after start_s ({self.start_s})")
        return self


class KillConfig(Section):
    target: Literal["worker", "ps"]
    index: int = Field(ge=0)
    at_s: float = Field(ge=0)
    """seconds after training starts"""


class FaultsConfig(Section):
    stragglers: list[StragglerConfig] = []
    """emulated slow workers"""
    kills: list[KillConfig] = []
    """processes killed (os._exit) at given times"""
    kill_mean_s: float = Field(0.0, ge=0)
    """if > 0, also kill random processes of kill_target with this mean time between kills"""
    kill_target: Literal["worker", "ps"] = "worker"
    seed: int = Field(0, ge=0)
