"""RunConfig: one validated tree (data, model, train, output, mode), loaded from TOML.

Every section rejects unknown keys and bad values with a message naming the key (``train.lr``)
and what was expected. ``--set key=value`` overrides are applied to the raw tree before
validation, so they are checked exactly like the file. The modes' sections are here; the
sections every run has, and faults and recovery, are in config_sections.py.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import Field, ValidationError, model_validator

from recsync.config_sections import (AtPoint, ClusterConfig, ConfigError, DataConfig,
                                     EmulationConfig, FaultsConfig,
                                     KillConfig, ModelConfig, NetworkConfig, OutputConfig,
                                     RecoveryConfig, Section, StragglerConfig, TrainConfig)
from recsync.safe_names import printable

__all__ = ["ClusterConfig", "ConfigError", "DataConfig", "EagerConfig", "FaultsConfig",
           "EmulationConfig", "GBAConfig", "HybridConfig", "KillConfig", "ModelConfig",
           "NetworkConfig",
           "OutputConfig", "RecoveryConfig", "RunConfig", "Section", "ShadowConfig",
           "StragglerConfig", "SwitchConfig", "SwitchingConfig", "TrainConfig", "apply_overrides",
           "load_config", "parse_override"]


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
    lr_modulation: Literal["inverse", "inverse_sqrt", "none"] = "inverse"
    """m(τ), the learning-rate multiplier of an update whose worker knew it missed τ updates:
    "inverse" 1 / max(1, τ), "inverse_sqrt" 1 / sqrt(max(1, τ)), "none" 1"""


class SwitchConfig(Section, AtPoint):
    to: Literal["sync", "gba"]
    """the mode to switch to"""
    at_s: float = Field(-1.0)
    """seconds after training starts (set this or at_step)"""
    at_step: int = Field(-1)
    """when the most advanced worker has done this many steps (set this or at_s)"""

    @model_validator(mode="after")
    def _check_when(self):
        return self.check_one_point(f"a switch to {self.to!r}")


class SwitchingConfig(Section):
    schedule: list[SwitchConfig] = []
    """switches between sync and gba at given times or steps, e.g.
    [{ to = "gba", at_s = 60.0 }, { to = "sync", at_step = 5000 }]"""
    auto: bool = False
    """let the mode controller switch: sync -> gba when a worker's compute time per step stays
    over ratio x the median for window_s, gba -> sync when it stays under"""
    ratio: float = Field(1.5, gt=1.0)
    """slowest / median compute time per step that means a straggler"""
    window_s: float = Field(5.0, gt=0)
    """how long the ratio (taken over the last 2 s of 0.5 s polls) must stay over (or under)
    the threshold before a switch"""

    @property
    def enabled(self) -> bool:
        return self.auto or bool(self.schedule)


class HybridConfig(Section):
    max_staleness: int = Field(2, ge=0)
    """mode hybrid: how many steps a worker's embedding pull may run ahead of the last step
    every PS shard has applied (0: it waits for every step before it, which is mode sync)"""


class RunConfig(Section):
    mode: Literal["local", "sync", "async", "gba", "shadow", "foreground", "eager",
                  "hybrid"] = "local"
    """how workers synchronize: "local" (one process, the baseline), "sync" (all-reduce dense
    gradients, PS applies row gradients once all workers' arrived), "async" (PS applies every
    gradient as it arrives), "gba" (PS applies the mean of a global batch of gradients, decaying
    stale ones; no worker waits), "shadow" (each worker trains its own dense replica with
    Hogwild threads, a background thread keeps the replicas in step: [shadow]), "foreground"
    (the same, synchronizing every shadow.foreground_every iterations inside training),
    "eager" (async with the next batch's pull sent before this one is computed, and learning
    rates scaled down for stale updates: [eager]), "hybrid" (dense gradients all-reduced every
    step as in sync, embedding rows with bounded staleness: [hybrid])"""
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    output: OutputConfig = OutputConfig()
    cluster: ClusterConfig = ClusterConfig()
    gba: GBAConfig = GBAConfig()
    switching: SwitchingConfig = SwitchingConfig()
    shadow: ShadowConfig = ShadowConfig()
    eager: EagerConfig = EagerConfig()
    hybrid: HybridConfig = HybridConfig()
    network: NetworkConfig = NetworkConfig()
    emulation: EmulationConfig = EmulationConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    faults: FaultsConfig = FaultsConfig()

    @model_validator(mode="after")
    def _check_faults(self):
        for i, s in enumerate(self.faults.stragglers):
            if s.worker >= self.cluster.workers:
                raise ValueError(f"faults.stragglers[{i}].worker = {s.worker}: workers run "
                                 f"from 0 to {self.cluster.workers - 1} (cluster.workers = "
                                 f"{self.cluster.workers})")
        for i, k in enumerate(self.faults.kills):
            count, key = {"worker": (self.cluster.workers, "cluster.workers"),
                          "ps": (self.cluster.ps_shards, "cluster.ps_shards"),
                          "standby": (self.recovery.standbys, "recovery.standby_shards")
                          }[k.target]
            if k.during and (k.target != "ps" or self.recovery.kind == "none"):
                raise ValueError(f"faults.kills[{i}].during = \"{k.during}\" needs target "
                                 f"\"ps\" and recovery on (recovery.kind)")
            if k.index >= count:
                raise ValueError(f"faults.kills[{i}].index = {k.index}: indexes of "
                                 f"{k.target} run from 0 to {count - 1} ({key} = "
                                 f"{count})")
        if self.switching.enabled and self.mode not in ("sync", "gba"):
            raise ValueError(f"switching: mode {self.mode!r} cannot switch; switching is "
                             f"between \"sync\" and \"gba\" (set mode to one of them)")
        if self.mode == "local" and (self.faults.stragglers or self.faults.kills
                                     or self.faults.kill_mean_s):
            raise ValueError("faults need a distributed mode (mode = \"sync\", \"async\", "
                             "\"gba\", \"shadow\", \"foreground\" or \"eager\")")
        r = self.recovery
        if r.kind != "none" and not (r.checkpoint_every_s or r.mtbf_s):
            raise ValueError(f"recovery.kind = \"{r.kind}\" restarts from checkpoints: set "
                             f"recovery.checkpoint_every_s > 0, or recovery.mtbf_s > 0 to have "
                             f"the interval chosen")
        if r.kind != "none" and self.switching.enabled:
            raise ValueError(f"recovery.kind = \"{r.kind}\" is not available with switching "
                             f"(the dense state moves between the workers and the PS)")
        if r.kind == "auto" and not r.mtbf_s:
            raise ValueError("recovery.kind = \"auto\" chooses from the mean time between "
                             "failures: set recovery.mtbf_s > 0")
        if r.kind in ("partial", "auto") and self.mode != "local" and _facts(self.mode).lockstep:
            raise ValueError(f"recovery.kind = \"{r.kind}\": mode {self.mode!r} steps the PS "
                             "shards in lock-step, which a shard rolled back alone would stall; "
                             f"use {_not_lockstep()} (or kind = \"full\")")
        if r.standby_shards > 0 and r.kind == "none":
            raise ValueError(f"recovery.standby_shards = {r.standby_shards}: a standby takes "
                             f"over a dead shard from its checkpoint, which recovery.kind = "
                             f"\"none\" does not do (set kind, or standby_shards = 0)")
        if r.rows != "all" and r.kind != "partial":
            raise ValueError(f"recovery.rows = \"{r.rows}\" saves part of the rows, which only "
                             f"partial recovery can restart from: set recovery.kind = "
                             f"\"partial\"")
        if self.mode == "local" and (self.recovery.checkpoint_every_s or self.recovery.mtbf_s):
            raise ValueError("recovery.checkpoint_every_s: checkpoints are of PS shards; mode "
                             "\"local\" has none (choose a distributed mode)")
        if self.mode == "local" and self.network.enabled:
            raise ValueError("network: the emulated network delays calls to PS shards; mode "
                             "\"local\" has none (choose a distributed mode)")
        if self.emulation.enabled:
            self._check_emulation()
        return self

    def _check_emulation(self) -> None:
        e = self.emulation
        if self.mode == "local":
            raise ValueError("emulation: the emulated cluster paces workers and PS shards; mode "
                             "\"local\" has none (choose a distributed mode)")
        if not (e.cores_per_worker > 0 and e.cores_per_shard > 0):
            raise ValueError(f"emulation: set both cores_per_worker and cores_per_shard (got "
                             f"{e.cores_per_worker:g} and {e.cores_per_shard:g})")
        if e.cores_per_shadow > 0 and not _facts(self.mode).shadow_thread:
            raise ValueError(f"emulation.cores_per_shadow: only mode \"shadow\" has a shadow "
                             f"thread (mode is \"{self.mode}\"); set it to 0")
        machine = os.cpu_count() or 1
        c = self.cluster
        per_worker = e.cores_per_worker + e.cores_per_shadow
        total = c.workers * per_worker + c.ps_shards * e.cores_per_shard
        if total > machine - e.reserve_cores + 1e-9:
            raise ValueError(
                f"emulation: {self.cluster.workers} workers x {per_worker:g} cores + "
                f"{self.cluster.ps_shards} shards x {e.cores_per_shard:g} cores = {total:g} cores, "
                f"more than this machine's {machine} cores less emulation.reserve_cores "
                f"({e.reserve_cores:g}) for Ray and the driver: the processes would slow each "
                f"other down and the emulation would not hold (fewer cores per process)")

    def to_toml(self) -> str:
        tree = self.model_dump(exclude_none=True)
        for s in tree["faults"]["stragglers"]:  # TOML has inf, tomli-w writes it as such
            s["end_s"] = float(s["end_s"])
        return tomli_w.dumps(tree)


def _facts(mode: str):
    """The driver facts of ``mode`` (modes/base.py Mode)."""
    from recsync.modes import MODES
    return MODES[mode]


def _not_lockstep() -> str:
    from recsync.modes import MODES
    names = [n for n, m in MODES.items() if not m.lockstep]
    return ", ".join(names[:-1]) + " or " + names[-1]


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid config"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        elif e["type"] == "value_error" and not key:  # a check across keys names them itself
            lines.append(f"  {e['ctx']['error']}")
        else:
            got = f" (got {e['input']!r})" if not isinstance(e["input"], dict) else ""
            lines.append(f"  {key}: {e['msg']}{got}")
    return "\n".join(lines)


MAX_DEPTH = 32  # tables and arrays within each other, in a config


def _check_depth(tree: dict, source: str) -> None:
    """ConfigError naming ``source`` where tables or arrays nest more than MAX_DEPTH deep
    (what reads the config later, e.g. a checkpoint's copy of it, recurses)."""
    stack = [(tree, 1, "")]
    while stack:
        node, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{printable(source, 200)}: {where or 'the config'} is nested "
                              f"more than {MAX_DEPTH} levels deep")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, (dict, list)):
                name = f"{where}.{key}" if isinstance(node, dict) else f"{where}[{key}]"
                stack.append((value, depth + 1, name.lstrip(".")[:120]))


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value); the value is read as TOML, else as a string."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.batch_size=1024")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as a path
    except RecursionError:
        raise ConfigError(f"--set {key.strip()}: the value is nested too deeply (at most "
                          f"{MAX_DEPTH} levels)") from None
    return [p.strip() for p in key.split(".")], value


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    for item in overrides:
        path, value = parse_override(item)
        node = tree
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part} is a value, not a section")
            node = child
        node[path[-1]] = value
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Read a TOML file (or start from defaults), apply ``--set`` overrides, validate."""
    tree: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            tree = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not a text file (a TOML config is UTF-8 text)") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except RecursionError:
            raise ConfigError(f"{path}: tables or arrays nested too deeply (at most "
                              f"{MAX_DEPTH} levels)") from None
    if overrides:
        source += " with --set " + " ".join(overrides)
    tree = apply_overrides(tree, list(overrides))
    _check_depth(tree, source)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None
