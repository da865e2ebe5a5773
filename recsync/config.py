"""RunConfig: one validated tree (data, model, train, output, mode), loaded from TOML.

Every section rejects unknown keys and bad values with a message naming the key (``train.lr``)
and what was expected. ``--set key=value`` overrides are applied to the raw tree before
validation, so they are checked exactly like the file. The sections every run has, and faults
and recovery, are in config_sections.py (the model's in config_model.py); the modes' sections
in modes/sections.py. The values of ``mode``, which modes' sections RunConfig has and the modes
named in messages come from MODES (modes/__init__.py), without importing the modes (and torch)
unless a check needs a mode's facts.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import Field, ValidationError, create_model, model_validator

from recsync.config_model import ModelConfig
from recsync.config_cluster import ClusterConfig
from recsync.config_sections import (AtPoint, ConfigError, DataConfig,
                                     EmulationConfig, FaultsConfig,
                                     KillConfig, NetworkConfig, OutputConfig,
                                     RecoveryConfig, Section, StragglerConfig, TrainConfig)
from recsync.modes import LOCAL, MODES
from recsync.safe_names import printable

__all__ = ["ClusterConfig", "ConfigError", "DataConfig", "EmulationConfig", "FaultsConfig",
           "KillConfig", "ModelConfig", "NetworkConfig", "OutputConfig", "RecoveryConfig",
           "RunConfig", "RunConfigBase", "Section", "StragglerConfig", "SwitchConfig",
           "SwitchingConfig", "TrainConfig", "apply_overrides", "load_config", "parse_override"]


ModeName = Literal[(LOCAL, *MODES)]  # the values of ``mode``


def _mode_description() -> str:
    """The description of ``mode`` (pydantic's, and its JSON schema's), from MODES."""
    modes = [f'"{name}" ({entry.summary}' + (f": [{entry.section[0]}])" if entry.section else ")")
             for name, entry in MODES.entries.items()]
    return (f'how workers synchronize: "{LOCAL}" (one process, the baseline), '
            + ", ".join(modes) + " (docs/sync_modes.md)")


def _quoted(names, last: str = "or") -> str:
    """'"a", "b" or "c"' (``last``: the word before the last name)."""
    quoted = [f'"{n}"' for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} {last} {quoted[-1]}"


class SwitchConfig(Section, AtPoint):
    to: ModeName
    """the mode to switch to: one that can switch (Mode.switchable), as the run's mode must be"""
    at_s: float = Field(-1.0)
    """seconds after training starts (set this or at_step)"""
    at_step: int = Field(-1)
    """when the most advanced worker has done this many steps (set this or at_s)"""

    @model_validator(mode="after")
    def _check_when(self):
        return self.check_one_point(f"a switch to {self.to!r}")


class SwitchingConfig(Section):
    schedule: list[SwitchConfig] = []
    """switches between the modes that can switch (sync and gba) at given times or steps, e.g.
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


class RunConfigBase(Section):
    """RunConfig without the modes' sections, which ``RunConfig`` adds from MODES."""

    mode: ModeName = Field(LOCAL, description=_mode_description())
    # (described by _mode_description, from MODES)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    output: OutputConfig = OutputConfig()
    cluster: ClusterConfig = ClusterConfig()
    switching: SwitchingConfig = SwitchingConfig()
    network: NetworkConfig = NetworkConfig()
    emulation: EmulationConfig = EmulationConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    faults: FaultsConfig = FaultsConfig()

    @property
    def distributed(self) -> bool:
        """Whether the run has workers and PS shards (a mode of MODES), not one process."""
        return self.mode != LOCAL

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
        if self.switching.enabled:
            self._check_switching()
        if not self.distributed and (self.faults.stragglers or self.faults.kills
                                     or self.faults.kill_mean_s):
            raise ValueError(f"faults need a distributed mode (mode = {_quoted(MODES)})")
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
        if r.kind in ("partial", "auto") and self.distributed and MODES[self.mode].lockstep:
            free = [n for n, m in MODES.items() if not m.lockstep]
            raise ValueError(f"recovery.kind = \"{r.kind}\": mode {self.mode!r} steps the PS "
                             "shards in lock-step, which a shard rolled back alone would stall; "
                             f"use mode {_quoted(free)} (or kind = \"full\")")
        if r.standby_shards > 0 and r.kind == "none":
            raise ValueError(f"recovery.standby_shards = {r.standby_shards}: a standby takes "
                             f"over a dead shard from its checkpoint, which recovery.kind = "
                             f"\"none\" does not do (set kind, or standby_shards = 0)")
        if r.rows != "all" and r.kind != "partial":
            raise ValueError(f"recovery.rows = \"{r.rows}\" saves part of the rows, which only "
                             f"partial recovery can restart from: set recovery.kind = "
                             f"\"partial\"")
        if not self.distributed and (self.recovery.checkpoint_every_s
                                     or self.recovery.mtbf_s):
            raise ValueError(f"recovery.checkpoint_every_s: checkpoints are of PS shards; mode "
                             f"\"{LOCAL}\" has none (choose a distributed mode)")
        if not self.distributed and self.network.enabled:
            raise ValueError(f"network: the emulated network delays calls to PS shards; mode "
                             f"\"{LOCAL}\" has none (choose a distributed mode)")
        if self.emulation.enabled:
            self._check_emulation()
        if self.cluster.elastic and self.distributed:
            self._check_elastic()
        return self

    def _check_elastic(self) -> None:
        c = self.cluster
        span = f"cluster.workers = [{c.workers_min}, {c.workers}]"
        if self.switching.enabled:
            raise ValueError(f"{span}: an elastic run cannot switch modes (switching into sync "
                             f"needs a fixed group); give one number of workers")
        if MODES[self.mode].elastic_join(self) is None:
            can = [n for n, m in MODES.items() if m.elastic_join(self) is not None]
            group = " (its workers form a process group, which is not rebuilt at another size)"
            raise ValueError(f"{span}: mode {self.mode!r} cannot change its number of workers "
                             f"during a run{group if MODES[self.mode].needs_group(self) else ''}"
                             f"; elastic modes at these settings: {_quoted(can)}")
        if self.recovery.kind in ("full", "auto"):
            raise ValueError(f"{span}: full recovery (which recovery.kind = "
                             f"\"{self.recovery.kind}\" may choose) rolls every worker back to "
                             f"a job checkpoint of a fixed set of workers; use recovery.kind = "
                             f"\"partial\" or \"none\"")

    def _check_emulation(self) -> None:
        e = self.emulation
        if not self.distributed:
            raise ValueError(f"emulation: the emulated cluster paces workers and PS shards; mode "
                             f"\"{LOCAL}\" has none (choose a distributed mode)")
        if not (e.cores_per_worker > 0 and e.cores_per_shard > 0):
            raise ValueError(f"emulation: set both cores_per_worker and cores_per_shard (got "
                             f"{e.cores_per_worker:g} and {e.cores_per_shard:g})")
        if e.cores_per_shadow > 0 and not MODES[self.mode].shadow_thread:
            have = [n for n, m in MODES.items() if m.shadow_thread]
            raise ValueError(f"emulation.cores_per_shadow: only mode {_quoted(have)} has a "
                             f"shadow thread (mode is \"{self.mode}\"); set it to 0")
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

    def _check_switching(self) -> None:
        can = [n for n, m in MODES.items() if m.switchable]
        if self.mode not in can:
            raise ValueError(f"switching: mode {self.mode!r} cannot switch; switching is "
                             f"between {_quoted(can, 'and')} (set mode to one of them)")
        for i, sw in enumerate(self.switching.schedule):
            if sw.to not in can:
                raise ValueError(f"switching.schedule[{i}].to = \"{sw.to}\": switching is "
                                 f"between {_quoted(can, 'and')}")

    def to_toml(self) -> str:
        tree = self.model_dump(exclude_none=True)
        c = tree["cluster"]
        if c.get("workers_min") is not None:  # written as given: an override of workers
            c["workers"] = [c.pop("workers_min"), c["workers"]]  # then replaces the range
        for s in tree["faults"]["stragglers"]:  # TOML has inf, tomli-w writes it as such
            s["end_s"] = float(s["end_s"])
        return tomli_w.dumps(tree)


RunConfig = create_model(
    "RunConfig", __base__=RunConfigBase, __module__=__name__,
    __doc__="The run's config: RunConfigBase's sections and the modes' ([key] of each mode's "
            "entry in MODES, its class in recsync/modes/sections.py).",
    **{key: (section, section()) for key, section in MODES.sections().items()})


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


def read_toml(path: str | Path, what: str) -> dict:
    """The TOML tree of the file at ``path`` (``what`` it is, for the errors); ConfigError in one
    line naming the file for a missing, unreadable, binary, invalid or too deeply nested one."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a {what} is UTF-8 TOML)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the {what} ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: tables or arrays nested too deeply (at most "
                          f"{MAX_DEPTH} levels)") from None


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Read a TOML file (or start from defaults), apply ``--set`` overrides, validate."""
    tree: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        tree = read_toml(path, "config file")
    if overrides:
        source += " with --set " + " ".join(overrides)
    tree = apply_overrides(tree, list(overrides))
    _check_depth(tree, source)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None
