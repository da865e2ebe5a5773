"""The config sections of the modes that have settings of their own. Pydantic only: config.py
builds RunConfig from them without importing the modes (and torch). A mode's entry in MODES
(modes/__init__.py) names its section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from recsync.config_sections import Section


class GBAConfig(Section):
    gradients_per_update: int = Field(0, ge=0)
    """M: gradients a PS shard aggregates into one update (0: cluster.workers, so that an update
    is on the global batch of mode sync, workers x train.batch_size samples)"""
    staleness_threshold: int = Field(4, ge=0)
    """ι: gradients at most this many updates stale count fully (see docs/sync_modes.md)"""
    decay: Literal["inverse", "drop", "none"] = "inverse"
    """what happens to a gradient staler than the threshold: "inverse" weighs it
    1 / (1 + staleness - threshold), "drop" drops it, "none" keeps it whole"""


class ShadowConfig(Section):
    algorithm: Literal["ma", "easgd", "bmuf", "none"] = "ma"
    """how the trainers' dense replicas are kept in step: "ma" (model averaging), "easgd"
    (elastic averaging against a center copy on PS shard 0), "bmuf" (block-wise model update
    filtering), "none" (never: each trainer trains its own dense replica)"""
    hogwild_threads: int = Field(1, ge=1)
    """training threads per trainer, sharing its dense replica without locks (Hogwild)"""
    min_interval_s: float = Field(0.1, ge=0)
    """mode shadow: the least time between the starts of two background syncs (0: back to
    back, as fast as they go). A shadow thread that loops without pause takes CPU and the GIL
    from training where no core is spare for it (2 trainers on 2 cores: -25% throughput at
    136 syncs/s), while syncing much more often than once per training step gains nothing"""
    foreground_every: int = Field(10, ge=1)
    """mode foreground: k, the training iterations of a trainer between two syncs"""
    easgd_alpha: float = Field(0.0, ge=0, le=1)
    """EASGD's moving rate alpha (0: 0.9 / cluster.workers, the EASGD paper's beta = 0.9)"""
    bmuf_momentum: float = Field(-1.0, lt=1)
    """BMUF's block momentum eta (< 0: 1 - 1 / cluster.workers)"""
    bmuf_lr: float = Field(1.0, gt=0)
    """BMUF's block learning rate zeta"""
    bmuf_nesterov: bool = False
    """BMUF: move the replicas to the Nesterov look-ahead w_g + eta x delta"""

    def alpha(self, trainers: int) -> float:
        return self.easgd_alpha or 0.9 / trainers

    def momentum(self, trainers: int) -> float:
        return self.bmuf_momentum if self.bmuf_momentum >= 0 else 1.0 - 1.0 / trainers


class EagerConfig(Section):
    overlap: bool = True
    """send the next batch's pull before computing this one, and push without waiting (false:
    pull, compute, push, each waited for: the baseline)"""
    own_update: Literal["wait", "local", "none"] = "wait"
    """with overlap the next batch's pull leaves before this step's push, so its dense
    parameters lack this worker's own last update: "wait" takes them from the push's answer
    (exact; each step waits for one push's round trip, which overlap would hide), "local"
    applies that update to them on the worker with the shard's optimizer and its state as
    pulled (no wait; misses the other workers' updates meanwhile: measured 0.011 AUC below sync
    in `bench modes`), "none" computes without it (an update staler: 0.055 below async)"""
    lr_modulation: Literal["inverse", "inverse_sqrt", "none"] = "inverse"
    """m(τ), the learning-rate multiplier of an update whose worker knew it missed τ updates:
    "inverse" 1 / max(1, τ), "inverse_sqrt" 1 / sqrt(max(1, τ)), "none" 1"""


class HybridConfig(Section):
    max_staleness: int = Field(2, ge=0)
    """mode hybrid: how many steps a worker's embedding pull may run ahead of the last step
    every PS shard has applied (0: it waits for every step before it, which is mode sync)"""
