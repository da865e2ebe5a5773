"""Model name -> builder. A builder gets ``ModelInputs`` and returns the dense module and the
tables it looks up (the contract: model/inputs.py).

``model.name`` is a built-in (``MODELS``) or a user's builder, ``"package.module:builder"``
(imported from sys.path: PYTHONPATH or an installed package) or ``"path/to/file.py:builder"``
(the file loaded by path, relative to the current directory). A user's builder is called as
``builder(inputs, **model.params)`` and returns a module (its tables are then
``feature_tables(inputs)``) or ``(module, tables)``. Anything a builder does wrong, raising
included (SystemExit too), is a ValueError of one line naming it and the contract (CONTRACT).

A model directory's ``model.name`` never reaches this module's imports: loading one builds a
built-in, or the builder its caller names (model_dir/trained.py).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

from torch import nn

from recsync.embedding.spec import TableSpec
from recsync.model.dcn import build_dcn
from recsync.model.deepfm import build_deepfm
from recsync.model.dlrm import build_dlrm
from recsync.model.inputs import ModelInputs, feature_tables
from recsync.model.lr import build_lr
from recsync.model.wide_deep import build_wide_deep
from recsync.safe_names import printable

MODELS = {"dlrm": build_dlrm, "dcn": build_dcn, "deepfm": build_deepfm,
          "wide_deep": build_wide_deep, "lr": build_lr}
CONTRACT = ("a builder is called as builder(inputs, **model.params) and returns a "
            "torch.nn.Module, or (module, tables) with tables a list of TableSpec; forward("
            "dense, embeddings) returns logits of shape [B] (recsync/model/inputs.py, "
            "docs/models.md)")
NAME_ATTR = "recsync_model_name"  # set on every built module: loss.py names it in errors


def apply_table_rows(cfg, inputs: ModelInputs) -> ModelInputs:
    """``inputs`` with every data table ``model.table_rows`` rows if set (never fewer than a
    fixed table's: its ids would not fit; a dynamic table's ids are not bounded by its rows),
    and ``model.embedding_dim`` as the default dim."""
    tables = inputs.tables
    if cfg.table_rows:
        largest = max((t for t in tables if not t.dynamic), key=lambda t: t.rows, default=None)
        if largest is not None and cfg.table_rows < largest.rows:
            raise ValueError(f"model.table_rows = {cfg.table_rows} is smaller than the data "
                             f"set's largest table ({largest.name}: {largest.rows} rows): ids "
                             f"would not fit")
        tables = tuple(replace(t, rows=cfg.table_rows) for t in tables)
    return replace(inputs, tables=tables, embedding_dim=cfg.embedding_dim)


def build_model(cfg, inputs: ModelInputs, *, builder: str | None = None
                ) -> tuple[nn.Module, list[TableSpec]]:
    """Build ``cfg.name`` (ModelConfig) for a data set's ``inputs`` (``apply_table_rows`` is
    applied here; applying it before is harmless). ``builder``: a user's builder to import and
    call instead of ``cfg.name`` (a model directory's caller's). ValueError: an unknown name
    (the message lists the built-ins), a user model that cannot be imported or returns the
    wrong thing."""
    inputs = apply_table_rows(cfg, inputs)
    if builder is None and ":" not in cfg.name:
        if cfg.name not in MODELS:
            raise ValueError(f"model.name: unknown model {cfg.name!r}; built-in: "
                             f"{sorted(MODELS)}, or a builder of your own as "
                             f"\"package.module:builder\" or \"path/to/file.py:builder\"")
        if cfg.params:
            raise ValueError(f"model.params is for a user's model; the built-in "
                             f"{cfg.name!r} takes its settings from model.* keys, got "
                             f"{sorted(cfg.params)}")
        return _named(MODELS[cfg.name](cfg, inputs), cfg.name)
    name = builder or cfg.name
    key = f"model.name = {printable(repr(name))}" if builder is None else \
        f"builder {printable(repr(name))}"
    fn = load_builder(name, key)
    try:
        built = fn(inputs, **cfg.params)
    except TypeError as e:  # most often model.params naming an argument it lacks
        raise ValueError(f"{key}: calling it with model.params {sorted(cfg.params)} failed: "
                         f"{printable(str(e), 200)}; {CONTRACT}") from e
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # the user's code may fail in any way, sys.exit included
        raise ValueError(f"{key}: the builder raised {type(e).__name__}: "
                         f"{printable(str(e), 200)}; {CONTRACT}") from e
    return _check_built(key, inputs, built, name)


def load_builder(name: str, key: str | None = None):
    """The callable ``name`` ("module:attr" or "file.py:attr") names; ValueError (starting
    with ``key``) if it cannot be imported."""
    key = key or f"model.name = {printable(repr(name))}"
    if not isinstance(name, str):
        raise ValueError(f"{key}: a user's model is \"package.module:builder\" or "
                         f"\"path/to/file.py:builder\"")
    where, _, attr = name.rpartition(":")
    if not where or not attr.isidentifier():
        raise ValueError(f"{key}: a user's model is \"package.module:builder\" or "
                         f"\"path/to/file.py:builder\"")
    if where.endswith(".py") and not Path(where).is_file():  # on a cluster's node, the file
        # comes in the run's py_modules (cluster.runtime_env_for) as module <stem>
        with contextlib.suppress(ImportError):
            where = Path(where).stem if importlib.util.find_spec(Path(where).stem) else where
    try:
        module = _load_file(where) if where.endswith(".py") else importlib.import_module(where)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # the user's module may fail in any way while it is imported,
        # sys.exit included: that must not end the process that loads it
        raise ValueError(f"{key}: cannot import {printable(repr(where))} ({type(e).__name__}: "
                         f"{printable(str(e), 200)})") from e
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ValueError(f"{key}: {printable(repr(where))} has no callable {attr!r}")
    return builder


def _load_file(path: str):
    """Load a Python file as a module, registered in sys.modules under a name derived from its
    resolved path (loading it again returns the same module)."""
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no such file {str(file)!r}")
    name = "recsync_user_model_" + "".join(c if c.isalnum() else "_" for c in str(file))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _named(built: tuple[nn.Module, list[TableSpec]], name: str):
    """``built`` with its module tagged with the model's name (NAME_ATTR)."""
    with contextlib.suppress(AttributeError, RuntimeError, TypeError):  # e.g. a ScriptModule
        setattr(built[0], NAME_ATTR, name)
    return built


def _check_built(key: str, inputs: ModelInputs, built, name: str
                 ) -> tuple[nn.Module, list[TableSpec]]:
    if isinstance(built, tuple) and len(built) != 2:
        raise ValueError(f"{key}: the builder returned a tuple of {len(built)}; {CONTRACT}")
    module, tables = (built if isinstance(built, tuple) else (built, None))
    if not isinstance(module, nn.Module):
        raise ValueError(f"{key}: the builder returned {type(module).__name__}, not a "
                         f"torch.nn.Module or (module, tables); {CONTRACT}")
    if tables is not None and not isinstance(tables, (list, tuple)):
        raise ValueError(f"{key}: the builder returned (module, {type(tables).__name__}); "
                         f"{CONTRACT}")
    tables = feature_tables(inputs) if tables is None else list(tables)
    sources = {t.name for t in inputs.tables}
    for t in tables:
        if not isinstance(t, TableSpec):
            raise ValueError(f"{key}: tables must be TableSpec, got {type(t).__name__}; "
                             f"{CONTRACT}")
        if t.source not in sources:
            raise ValueError(f"{key}: table {t.name!r} reads data table {t.source!r}, which "
                             f"the data set lacks (it has {sorted(sources)})")
    if len({t.name for t in tables}) != len(tables):
        raise ValueError(f"{key}: table names repeat: {[t.name for t in tables]}")
    return _named((module, tables), name)
