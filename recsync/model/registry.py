"""Model name -> builder. A builder gets ``ModelInputs`` and returns the dense module and the
tables it looks up (the contract: model/inputs.py).

``model.name`` is a built-in (``MODELS``) or a user's builder, ``"package.module:builder"``
(imported from sys.path: PYTHONPATH or an installed package) or ``"path/to/file.py:builder"``
(the file loaded by path, relative to the current directory). A user's builder is called as
``builder(inputs, **model.params)`` and returns a module (its tables are then
``feature_tables(inputs)``) or ``(module, tables)``.
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

MODELS = {"dlrm": build_dlrm, "dcn": build_dcn, "deepfm": build_deepfm,
          "wide_deep": build_wide_deep, "lr": build_lr}


def apply_table_rows(cfg, inputs: ModelInputs) -> ModelInputs:
    """``inputs`` with every data table ``model.table_rows`` rows if set (never fewer than the
    data's: ids would not fit), and ``model.embedding_dim`` as the default dim."""
    tables = inputs.tables
    if cfg.table_rows:
        largest = max(tables, key=lambda t: t.rows, default=None)
        if largest is not None and cfg.table_rows < largest.rows:
            raise ValueError(f"model.table_rows = {cfg.table_rows} is smaller than the data "
                             f"set's largest table ({largest.name}: {largest.rows} rows): ids "
                             f"would not fit")
        tables = tuple(replace(t, rows=cfg.table_rows) for t in tables)
    return replace(inputs, tables=tables, embedding_dim=cfg.embedding_dim)


def build_model(cfg, inputs: ModelInputs) -> tuple[nn.Module, list[TableSpec]]:
    """Build ``cfg.name`` (ModelConfig) for a data set's ``inputs`` (``apply_table_rows`` is
    applied here; applying it before is harmless). ValueError: an unknown name (the message
    lists the built-ins), a user model that cannot be imported or returns the wrong thing."""
    inputs = apply_table_rows(cfg, inputs)
    if ":" not in cfg.name:
        if cfg.name not in MODELS:
            raise ValueError(f"model.name: unknown model {cfg.name!r}; built-in: "
                             f"{sorted(MODELS)}, or a builder of your own as "
                             f"\"package.module:builder\" or \"path/to/file.py:builder\"")
        if cfg.params:
            raise ValueError(f"model.params is for a user's model; the built-in "
                             f"{cfg.name!r} takes its settings from model.* keys, got "
                             f"{sorted(cfg.params)}")
        return MODELS[cfg.name](cfg, inputs)
    builder = load_builder(cfg.name)
    try:
        built = builder(inputs, **cfg.params)
    except TypeError as e:  # most often model.params naming an argument it lacks
        raise ValueError(f"model.name = {cfg.name!r}: calling it with model.params "
                         f"{sorted(cfg.params)} failed: {e}") from e
    return _check_built(cfg.name, inputs, built)


def load_builder(name: str):
    """The callable ``name`` ("module:attr" or "file.py:attr") names; ValueError if it cannot
    be imported."""
    where, _, attr = name.rpartition(":")
    key = f"model.name = {name!r}"
    if not where or not attr:
        raise ValueError(f"{key}: a user's model is \"package.module:builder\" or "
                         f"\"path/to/file.py:builder\"")
    if where.endswith(".py") and not Path(where).is_file():  # on a cluster's node, the file
        # comes in the run's py_modules (cluster.runtime_env_for) as module <stem>
        with contextlib.suppress(ImportError):
            where = Path(where).stem if importlib.util.find_spec(Path(where).stem) else where
    try:
        module = _load_file(where) if where.endswith(".py") else importlib.import_module(where)
    except Exception as e:  # the user's module may fail in any way while it is imported
        raise ValueError(f"{key}: cannot import {where!r} ({type(e).__name__}: {e})") from e
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ValueError(f"{key}: {where!r} has no callable {attr!r}")
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


def _check_built(name: str, inputs: ModelInputs, built) -> tuple[nn.Module, list[TableSpec]]:
    module, tables = (built if isinstance(built, tuple) else (built, None))
    if not isinstance(module, nn.Module):
        raise ValueError(f"model.name = {name!r}: the builder returned {type(module).__name__}"
                         f", not a torch.nn.Module or (module, tables)")
    tables = feature_tables(inputs) if tables is None else list(tables)
    sources = {t.name for t in inputs.tables}
    for t in tables:
        if not isinstance(t, TableSpec):
            raise ValueError(f"model.name = {name!r}: tables must be TableSpec, got "
                             f"{type(t).__name__}")
        if t.source not in sources:
            raise ValueError(f"model.name = {name!r}: table {t.name!r} reads data table "
                             f"{t.source!r}, which the data set lacks (it has "
                             f"{sorted(sources)})")
    if len({t.name for t in tables}) != len(tables):
        raise ValueError(f"model.name = {name!r}: table names repeat: "
                         f"{[t.name for t in tables]}")
    return module, tables
