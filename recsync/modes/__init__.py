"""The sync modes, by name: one module each behind the contract in base.py. ``MODES`` below is
the one list of them: config.py takes from it the values of ``mode``, the modes' config sections
and the names in its messages, and the driver each mode's facts (its ``Mode``). Adding a mode is
its module and one line here (docs/architecture.md, "Adding a mode").

A mode's module is imported when the mode is first looked up (``MODES[name]``), not here: the
modes import torch (over a second), and reading a config or ``recsync --help`` should not.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from recsync.modes.base import Mode

LOCAL = "local"
"""mode "local": one process and no PS (recsync/run/local_run.py), the baseline every mode is held
to; not a ``Mode``, so not in MODES."""


class Entry(NamedTuple):
    """One mode of MODES."""

    mode: str
    """where its ``Mode`` is, "package.module:Class\""""
    summary: str
    """what it does, in one line (the config's description of ``mode`` lists these)"""
    section: tuple[str, str] | None = None
    """its config section: (its table's key in a config, "package.module:Class" of the
    section), or None (no settings of its own); modes may share a section"""


class UnknownMode(KeyError, ValueError):
    """``MODES[name]`` of a name it lacks: a KeyError as a mapping's miss (``MODES.get``), a
    ValueError as bad input. The message lists the modes."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Mapping):
    """``MODES``: name -> ``Mode``. Iterating, ``in`` and ``len`` read the names alone;
    ``MODES[name]`` imports the mode's module (once) and checks what it finds there."""

    def __init__(self, entries: dict[str, Entry]):
        self.entries = entries
        self._loaded: dict[str, type[Mode]] = {}

    def __getitem__(self, name: str) -> type[Mode]:
        if name not in self.entries:
            raise UnknownMode(f"unknown mode {name!r}: the modes are {', '.join(self)} (and "
                              f"{LOCAL!r}, one process)")
        mode = self._loaded.get(name)
        if mode is None:
            mode = self._loaded[name] = _load_mode(name, self.entries[name].mode)
        return mode

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name) -> bool:
        return name in self.entries

    def sections(self) -> dict[str, type]:
        """{key: section class} of the modes' config sections, each once, in MODES' order (no
        mode's module is imported)."""
        sections: dict[str, type] = {}
        for name, entry in self.entries.items():
            if entry.section is None:
                continue
            key, where = entry.section
            cls = _attribute(where)
            if sections.setdefault(key, cls) is not cls:
                raise TypeError(f"MODES[{name!r}]: section [{key}] is {where}, but another mode "
                                f"gives [{key}] another class")
        return sections


def _attribute(where: str):
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr)


def _load_mode(name: str, where: str) -> type[Mode]:
    """The Mode at ``where``, checked: a complete Mode whose name is ``name``."""
    from recsync.modes.base import Mode, contract_gaps
    cls = _attribute(where)
    if not (isinstance(cls, type) and issubclass(cls, Mode)):
        raise TypeError(f"MODES[{name!r}] is {where}, which is not a Mode (recsync/modes/base.py)")
    if cls.name != name:
        raise TypeError(f"MODES[{name!r}] is {where}, whose name is {cls.name!r}: a mode's name "
                        f"is its key in MODES")
    gaps = contract_gaps(cls)  # a class made by type() is checked here, not when it was made
    if gaps:
        raise TypeError(f"MODES[{name!r}] is {where}, which does not define {'; '.join(gaps)}")
    return cls


_SHADOW = ("shadow", "recsync.modes.sections:ShadowConfig")

# New modes go at the end: TensorBoard's train/mode is a mode's place in [LOCAL, *MODES].
MODES = Registry({
    "sync": Entry("recsync.modes.sync:Sync", "all-reduce dense gradients, PS applies row "
                  "gradients once all workers' arrived"),
    "async": Entry("recsync.modes.async_ps:Async", "PS applies every gradient as it arrives"),
    "gba": Entry("recsync.modes.gba:GBA", "PS applies the mean of a global batch of "
                 "gradients, decaying stale ones; no worker waits",
                 ("gba", "recsync.modes.sections:GBAConfig")),
    "shadow": Entry("recsync.modes.shadow:Shadow", "each worker trains its own dense replica "
                    "with Hogwild threads, a background thread keeps the replicas in step",
                    _SHADOW),
    "foreground": Entry("recsync.modes.shadow:Foreground", "as shadow, synchronizing every "
                        "shadow.foreground_every iterations inside training", _SHADOW),
    "eager": Entry("recsync.modes.eager:Eager", "async with the next batch's pull sent before "
                   "this one is computed, and learning rates scaled down for stale updates",
                   ("eager", "recsync.modes.sections:EagerConfig")),
    "hybrid": Entry("recsync.modes.hybrid:Hybrid", "dense gradients all-reduced every step as "
                    "in sync, embedding rows with bounded staleness",
                    ("hybrid", "recsync.modes.sections:HybridConfig")),
})
