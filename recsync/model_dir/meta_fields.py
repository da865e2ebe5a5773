"""Checks of model.json's fields before anything is opened, sized or built from them.

A model directory may come from elsewhere, so model.json is untrusted input: table sizes become
allocations, file names become paths and ``model`` becomes a module. Every field a reader uses
is type- and range-checked here (``model`` through ModelConfig, with its bounds; ``data`` as a
data set's meta.json is), and a failure is one line naming the file and the key.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import ValidationError

from recsync.data.meta_checks import MAX_DIM, MAX_MODEL_TABLES, MAX_TABLE_ROWS
from recsync.data.meta_checks import MAX_NAME_CHARS as MAX_NAME
from recsync.safe_names import printable

MAX_MODEL_JSON_BYTES = 64 * 2**20  # a model.json of 100,000 features is a few MB
MAX_STATE_DIM = 1024  # a row optimizer's state per row (adagrad: 1)
MAX_TABLES = MAX_MODEL_TABLES
MAX_PARAMETERS = 2**40
MAX_INIT_SCALE = 1e38  # rows are float32: 2 x scale must stay finite


class ModelDirError(ValueError):
    """A model directory that cannot be used; the message names the file."""


def quoted(value) -> str:
    """``value`` as repr quotes it, for a one-line message: escaped and cut short."""
    return printable(repr(value))


def _int(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _name(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME and v.isprintable()


_NOTHING = object()  # bad(): no value to show


class _Checker:
    def __init__(self, file: Path):
        self.file = file

    def bad(self, key: str, why: str, got=_NOTHING):
        shown = "" if got is _NOTHING else f", got {quoted(got)}"
        raise ModelDirError(f"{self.file}: {key} {why}{shown}")

    def section(self, meta: dict, key: str, optional: bool = False) -> dict | None:
        value = meta.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, dict):
            self.bad(key, "must be an object", value)
        return value

    def integer(self, section: dict, prefix: str, key: str, lo: int, hi: int,
                default=None) -> None:
        value = section.get(key, default)
        if not _int(value, lo, hi):
            self.bad(f"{prefix}{key}", f"must be an integer in [{lo}, {hi}]", value)


def model_config(meta: dict, file: Path):
    """model.json's ``model`` as a ModelConfig (its types and bounds checked); ModelDirError
    naming the key otherwise."""
    from recsync.config_model import ModelConfig
    model = meta.get("model")
    if not isinstance(model, dict):
        raise ModelDirError(f"{file}: model must be an object, got {quoted(model)}")
    if "name" in model and not _name(model["name"]):
        raise ModelDirError(f"{file}: model.name must be a name of at most {MAX_NAME} "
                            f"printable characters, got {quoted(model['name'])}")
    try:
        return ModelConfig.model_validate(model)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        got = "" if isinstance(err.get("input"), dict) else f" (got {quoted(err['input'])})"
        raise ModelDirError(f"{file}: model.{printable(key)}: {printable(err['msg'], 200)}"
                            f"{got}") from None


def check_fields(meta: dict, file: Path) -> None:
    """Check every field of ``meta`` (model.json, format and version already checked) that a
    reader uses; ModelDirError naming ``file`` and the key."""
    c = _Checker(file)
    for key in ("model", "train", "data", "tables", "dense"):
        if key not in meta:
            c.bad(key, "is missing")
    model_config(meta, file)
    _train(c, c.section(meta, "train"))
    _data(c, c.section(meta, "data"))
    files = _tables(c, meta["tables"])
    dense = c.section(meta, "dense")
    if not _name(dense.get("file")):
        c.bad("dense.file", "must be a file name", dense.get("file"))
    c.integer(dense, "dense.", "parameters", 0, MAX_PARAMETERS)
    files.append(dense["file"])
    if not isinstance(meta.get("optimizer_state", False), bool):
        c.bad("optimizer_state", "must be true or false", meta["optimizer_state"])
    opt = c.section(meta, "dense_optimizer", optional=True)
    if opt is not None:
        files.append(_dense_optimizer(c, opt))
    if len(set(files)) != len(files):
        c.bad("tables[].file", "and dense.file must name different files", files)


def _train(c: _Checker, train: dict) -> None:
    c.integer(train, "train.", "seed", 0, 2**63 - 1)
    scale = train.get("embedding_init_scale")
    if not _number(scale) or not 0 < scale <= MAX_INIT_SCALE:
        c.bad("train.embedding_init_scale", f"must be a number in (0, {MAX_INIT_SCALE:g}]",
              scale)
    for key in ("embedding_optimizer", "dense_optimizer"):
        if key in train and not _name(train[key]):
            c.bad(f"train.{key}", "must be an optimizer's name", train[key])
    for key in ("embedding_lr", "dense_lr"):
        if key in train and not _number(train[key]):
            c.bad(f"train.{key}", "must be a finite number", train[key])


def _data(c: _Checker, data: dict) -> None:
    """The data set's layout, checked as a data set's meta.json is (but for its splits)."""
    from recsync.data.format import POOLINGS, SPLITS
    from recsync.data.meta_checks import DataFormatError, check_meta
    try:
        check_meta({"id_dtype": "int64", **data, "splits": {}}, f"{c.file}: data",
                   SPLITS, POOLINGS)
    except DataFormatError as e:
        raise ModelDirError(printable(str(e), 400)) from None
    rate = data.get("base_rate")
    if rate is not None and not (_number(rate) and 0 <= rate <= 1):
        c.bad("data.base_rate", "must be null or a number in [0, 1]", rate)


def _tables(c: _Checker, tables) -> list[str]:
    """Check every table entry; returns their file names."""
    if not isinstance(tables, list) or len(tables) > MAX_TABLES:
        c.bad("tables", f"must be a list of at most {MAX_TABLES} tables", tables)
    files = []
    for i, t in enumerate(tables):
        key = f"tables[{i}]."
        if not isinstance(t, dict):
            c.bad(f"tables[{i}]", "must be an object", t)
        for field in ("name", "source", "file"):
            if not _name(t.get(field)):
                c.bad(key + field, f"must be a name of at most {MAX_NAME} printable "
                                   f"characters", t.get(field))
        c.integer(t, key, "rows", 1, MAX_TABLE_ROWS)
        c.integer(t, key, "dim", 1, MAX_DIM)
        if t.setdefault("kind", "fixed") not in ("fixed", "dynamic"):
            c.bad(key + "kind", 'must be "fixed" or "dynamic"', t["kind"])
        # a dynamic table's ids are 64-bit keys, not row numbers: its rows do not bound them
        c.integer(t, key, "trained_rows", 0,
                  t["rows"] if t["kind"] == "fixed" else MAX_TABLE_ROWS)
        c.integer(t, key, "state_dim", 0, MAX_STATE_DIM, default=0)
        files.append(t["file"])
    return files


def _dense_optimizer(c: _Checker, opt: dict) -> str:
    """Check the dense optimizer's entry; returns its file name."""
    from recsync.model.optim import UPDATES
    if not _name(opt.get("file")):
        c.bad("dense_optimizer.file", "must be a file name", opt.get("file"))
    groups = opt.get("param_groups")
    if (not isinstance(groups, list) or not 1 <= len(groups) <= 1000
            or not all(isinstance(g, dict) for g in groups)):
        c.bad("dense_optimizer.param_groups", "must be a list of objects", groups)
    c.integer(groups[0], "dense_optimizer.param_groups[0].", UPDATES, 0, 2**63 - 1, default=0)
    scalars = opt.get("scalars", {})
    if not isinstance(scalars, dict) or not all(
            isinstance(k, str) and k.isprintable() and _number(v) for k, v in scalars.items()):
        c.bad("dense_optimizer.scalars", "must map names to finite numbers", scalars)
    return opt["file"]
