"""Read a model directory (write.py) back: model.json checked, tensors loaded with safetensors
only (nothing is unpickled, so a model directory cannot run code), shapes checked against
model.json. Every problem is one line naming the file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from recsync.model_dir.write import (DENSE_FILE, DENSE_OPTIMIZER_FILE, FORMAT_NAME,
                                     FORMAT_VERSION, MODEL_JSON)


class ModelDirError(ValueError):
    """A model directory that cannot be used; the message names the file."""


@dataclass
class ModelFiles:
    """What a model directory holds: ``meta`` (model.json), ``dense_state`` (the dense
    module's state_dict), ``tables`` (per table: ids int64 [n], rows float32 [n, dim], state
    float32 [n, state_dim] or None), ``dense_optimizer_state`` (the flat layout of
    modes/handover.py, or None)."""

    path: Path
    meta: dict
    dense_state: dict[str, torch.Tensor]
    tables: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    dense_optimizer_state: dict | None


def read_meta(path: str | Path) -> dict:
    """model.json of the model directory ``path``, checked."""
    root = Path(path)
    file = root / MODEL_JSON
    if not root.is_dir():
        raise ModelDirError(f"{root}: no such model directory (a run writes one as OUT/model)")
    if not file.is_file():
        raise ModelDirError(f"{file}: missing; {root} is not a complete model directory")
    try:
        meta = json.loads(file.read_bytes())
    except (ValueError, RecursionError) as e:
        raise ModelDirError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelDirError(f"{file}: format is {got!r:.80}, expected {FORMAT_NAME!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelDirError(f"{file}: format_version {meta.get('format_version')!r:.40} is not "
                            f"supported (this recsync reads version {FORMAT_VERSION})")
    for key in ("model", "train", "data", "tables", "dense"):
        if key not in meta:
            raise ModelDirError(f"{file}: lacks {key!r}")
    if not isinstance(meta["tables"], list):
        raise ModelDirError(f"{file}: tables must be a list")
    return meta


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; ModelDirError if it is missing or damaged."""
    if not file.is_file():
        raise ModelDirError(f"{file}: missing (named by model.json)")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelDirError(f"{file}: cannot be read as safetensors "
                            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                            ) from None


def read_model_dir(path: str | Path) -> ModelFiles:
    """Load a model directory; ModelDirError (one line, naming the file) if anything is
    missing, damaged or does not match model.json."""
    root = Path(path)
    meta = read_meta(root)
    dense_file = root / _name(root, meta["dense"].get("file", DENSE_FILE))
    dense = load_tensors(dense_file)
    params = sum(int(v.numel()) for v in dense.values())
    if params != meta["dense"].get("parameters"):
        raise ModelDirError(f"{dense_file}: {params} parameters, model.json says "
                            f"{meta['dense'].get('parameters')}")
    tables = [_read_table(root, t) for t in meta["tables"]]
    optimizer = None
    opt = meta.get("dense_optimizer")
    if opt:
        state = load_tensors(root / _name(root, opt.get("file", DENSE_OPTIMIZER_FILE)))
        state.update(opt.get("scalars") or {})
        optimizer = {"state": {0: state} if state else {}, "param_groups": opt["param_groups"]}
    return ModelFiles(root, meta, dense, tables, optimizer)


def _name(root: Path, name) -> str:
    """A file name from model.json: a plain name inside the directory, nothing else."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".",
                                                                                      ".."):
        raise ModelDirError(f"{root / MODEL_JSON}: bad file name {name!r:.80}")
    return name


def _read_table(root: Path, t: dict):
    try:
        name, rows, dim, trained = t["name"], int(t["rows"]), int(t["dim"]), t["trained_rows"]
        file = root / _name(root, t["file"])
    except (KeyError, TypeError, ValueError) as e:
        raise ModelDirError(f"{root / MODEL_JSON}: a table entry lacks or has a bad {e}"
                            ) from None
    arrays = load_tensors(file)
    ids, values = arrays.get("ids"), arrays.get("rows")
    if ids is None or values is None:
        raise ModelDirError(f"{file}: must hold tensors 'ids' and 'rows', has "
                            f"{sorted(arrays)}")
    if ids.dtype != torch.int64 or ids.shape != (trained,):
        raise ModelDirError(f"{file}: ids are {ids.dtype} {list(ids.shape)}, model.json says "
                            f"int64 [{trained}] (table {name})")
    if values.dtype != torch.float32 or values.shape != (trained, dim):
        raise ModelDirError(f"{file}: rows are {values.dtype} {list(values.shape)}, model.json "
                            f"says float32 [{trained}, {dim}] (table {name})")
    if trained and (int(ids[0]) < 0 or int(ids[-1]) >= rows
                    or bool((ids[1:] <= ids[:-1]).any())):
        raise ModelDirError(f"{file}: ids must be ascending, unique and in [0, {rows}) "
                            f"(table {name})")
    state = arrays.get("state")
    if state is not None:
        state_dim = int(t.get("state_dim", 0))
        if state.dtype != torch.float32 or state.shape != (trained, state_dim):
            raise ModelDirError(f"{file}: state is {state.dtype} {list(state.shape)}, "
                                f"model.json says float32 [{trained}, {state_dim}]")
    return ids, values, state
