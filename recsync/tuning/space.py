"""The search space of `recsync tune`: a TOML file whose keys are config keys and whose values
say how each is drawn. No Ray here: the file is read and checked before anything starts.

    "train.dense_lr" = {loguniform = [1e-4, 1e-1]}    # floats, uniform in log space
    "model.dropout"  = {uniform = [0.0, 0.3]}         # floats
    "train.batch_size" = {logint = [64, 1024]}        # integers, inclusive, uniform in log space
    "model.cross_layers" = {int = [1, 4]}             # integers, inclusive
    "model.name"     = {choice = ["dlrm", "dcn"]}     # one of the values, at random
    "model.embedding_dim" = {grid = [8, 16]}          # every value, each with the others' draws

A dotted key may also be written as TOML tables (``[train]`` then ``dense_lr = {...}``). Each
value is checked against the base config as an override would be (``recsync.api.override``),
so a bound or choice the config refuses is named here, before any trial runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recsync.config import ConfigError, RunConfig, read_toml

# distribution -> what its value is
DISTRIBUTIONS = {
    "loguniform": "[low, high], 0 < low < high: floats uniform in log space",
    "uniform": "[low, high], low < high: floats",
    "int": "[low, high], low <= high: integers, both ends included",
    "logint": "[low, high], 1 <= low <= high: integers in log space, both ends included",
    "choice": "[value, ...]: one of them at random",
    "grid": "[value, ...]: every one of them (the trials are split evenly between them)",
}
EXAMPLE = '"train.dense_lr" = {loguniform = [1e-4, 1e-1]}'


@dataclass(frozen=True)
class Param:
    """One searched key: ``kind`` a name of DISTRIBUTIONS, ``values`` its bounds (range kinds)
    or its values (choice, grid)."""

    key: str
    kind: str
    values: tuple

    def describe(self) -> str:
        if self.kind in ("choice", "grid"):
            return f"{self.key} {self.kind} of {len(self.values)}"
        return f"{self.key} {self.kind} [{self.values[0]:g}, {self.values[1]:g}]"


@dataclass(frozen=True)
class Space:
    """A parsed search space: its keys in file order."""

    params: tuple[Param, ...]
    source: str

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.params]

    @property
    def grid_points(self) -> int:
        """How many combinations the grid keys make (1: no grid)."""
        return math.prod(len(p.values) for p in self.params if p.kind == "grid")

    def values_of(self, key: str) -> tuple:
        """Every value ``key`` may take where it is a choice or grid (else its bounds)."""
        return next(p.values for p in self.params if p.key == key)


def load_space(path: str | Path, base: RunConfig) -> Space:
    """Read and check the space file ``path`` against the base config ``base``; ConfigError
    (one line naming the file and the key) for anything wrong."""
    source = str(path)
    tree = read_toml(path, "search space file")
    return parse_space(tree, base, source)


def parse_space(tree: dict, base: RunConfig, source: str = "search space") -> Space:
    """A space from the TOML tree of a space file (see the module docstring)."""
    params = [parse_param(key, spec, base, source) for key, spec in _flatten(tree, source)]
    keys = [p.key for p in params]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice:
        raise ConfigError(f"{source}: {twice}: given twice (as a dotted key and in a table)")
    if not params:
        raise ConfigError(f"{source}: no key to search; give at least one, e.g. {EXAMPLE}")
    return Space(tuple(params), source)


def _flatten(tree: dict, source: str, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, distribution table) of every leaf: a table is a distribution where it
    names one (``{loguniform = [...]}``), else a section whose keys go on the path."""
    out = []
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value and not (set(value) & set(DISTRIBUTIONS)) \
                and all(isinstance(v, dict) for v in value.values()):
            out.extend(_flatten(value, source, key + "."))
        else:
            out.append((key, value))
    return out


def parse_param(key: str, spec: Any, base: RunConfig, source: str) -> Param:
    """One key's distribution, checked: the key is a config key, the distribution is known,
    its bounds are in order and every bound or value is one the config accepts."""
    where = f"{source}: {key}"
    check_key(key, base, source)
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a distribution table such as {{choice = "
                          f"[...]}} or {{loguniform = [low, high]}} (got {spec!r})")
    if len(spec) != 1:
        names = ", ".join(spec) or "nothing"
        raise ConfigError(f"{where}: give exactly one distribution (got {names}); one of "
                          f"{', '.join(DISTRIBUTIONS)}")
    (kind, values), = spec.items()
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: unknown distribution {kind!r}; one of "
                          f"{', '.join(DISTRIBUTIONS)}")
    if not isinstance(values, list):
        raise ConfigError(f"{where}: {kind} takes {DISTRIBUTIONS[kind]} (got {values!r})")
    if kind in ("choice", "grid"):
        values = _checked_list(where, kind, values)
    else:
        values = _checked_bounds(where, kind, values)
    for value in values:  # what the config says of the value itself (type, range)
        _check_value(key, value, base, source)
    return Param(key, kind, tuple(values))


def _checked_list(where: str, kind: str, values: list) -> list:
    if not values:
        raise ConfigError(f"{where}: {kind} needs at least one value")
    seen = []
    for v in values:
        if v in seen:
            raise ConfigError(f"{where}: {kind} lists {v!r} twice")
        seen.append(v)
    return values


def _checked_bounds(where: str, kind: str, values: list) -> list:
    if len(values) != 2:
        raise ConfigError(f"{where}: {kind} takes {DISTRIBUTIONS[kind]} (got {len(values)} "
                          f"values)")
    integer = kind in ("int", "logint")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
            wanted = "integers" if integer else "numbers"
            raise ConfigError(f"{where}: {kind} bounds must be {wanted} (got {v!r})")
        if not integer and not math.isfinite(v):
            raise ConfigError(f"{where}: {kind} bounds must be finite (got {v!r})")
    low, high = values
    if kind in ("loguniform", "logint") and low <= 0:
        raise ConfigError(f"{where}: {kind} needs low > 0 (got {low!r})")
    if kind == "logint" and low < 1:
        raise ConfigError(f"{where}: logint needs low >= 1 (got {low!r})")
    if (low >= high) if not integer else (low > high):
        order = "low < high" if not integer else "low <= high"
        raise ConfigError(f"{where}: {kind} needs {order} (got [{low!r}, {high!r}])")
    return [float(low), float(high)] if not integer else [low, high]


def check_key(key: str, base: RunConfig, source: str) -> None:
    """ConfigError unless ``key`` names a value of the config (``train.dense_lr``), not a
    section (``train``) or a key no section has; under a free-form table (model.params,
    cluster.runtime_env) any name goes."""
    node: Any = type(base)
    path = key.split(".")
    for i, part in enumerate(path):
        fields = getattr(node, "model_fields", None)
        if fields is None:  # a dict-valued field: its keys are the user's
            return
        if part not in fields:
            section = ".".join(path[:i]) or "the config"
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: {key}: unknown config key ({section} has {known})")
        annotation = fields[part].annotation
        node = annotation if isinstance(annotation, type) else None
        if node is not None and not hasattr(node, "model_fields"):
            node = None  # a value: nothing may follow it
        if node is None and i < len(path) - 1:
            if "dict" in str(annotation):  # model.params.NAME, cluster.runtime_env.NAME
                return
            raise ConfigError(f"{source}: {key}: {'.'.join(path[:i + 1])} is a value, not a "
                              f"section")
    if node is not None and hasattr(node, "model_fields"):
        raise ConfigError(f"{source}: {key}: is a section, not a value (name one of its keys, "
                          f"e.g. {key}.{next(iter(node.model_fields))})")


def _check_value(key: str, value: Any, base: RunConfig, source: str) -> None:
    """The base config with ``key`` set to ``value``, validated; ConfigError in one line
    naming the key and the value otherwise."""
    from recsync.api import override
    try:
        override(base, **{key: value})
    except (ConfigError, ValueError) as e:
        lines = [line.strip() for line in str(e).splitlines()[1:] if line.strip()]
        detail = lines[0] if lines else str(e).splitlines()[0]
        raise ConfigError(f"{source}: {key} = {value!r} is refused by the config: "
                          f"{detail}") from None
