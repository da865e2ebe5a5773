"""Read a model directory (write.py) back: model.json checked, tensors loaded with safetensors
only (nothing is unpickled), shapes checked against model.json. Reading never imports or runs
anything: model.json is untrusted input, so every field is type- and range-checked before use,
every file it names must stay inside the directory after resolving symlinks, and NaN or
infinite weights are refused. Every problem is one line naming the file (and key or tensor)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from recsync.model_dir.meta_fields import (MAX_MODEL_JSON_BYTES, ModelDirError, check_fields,
                                           quoted)
from recsync.model_dir.write import FORMAT_NAME, FORMAT_VERSION, MODEL_JSON
from recsync.safe_names import UnsafeName, inside, printable, regular_file


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
    """model.json of the model directory ``path``, every field checked (meta_fields.py)."""
    root = Path(path)
    file = root / MODEL_JSON
    if not root.is_dir():
        raise ModelDirError(f"{root}: no such model directory (a run writes one as OUT/model)")
    real = member(root, MODEL_JSON, "file")
    if not real.is_file():
        raise ModelDirError(f"{file}: missing; {root} is not a complete model directory")
    if real.stat().st_size > MAX_MODEL_JSON_BYTES:
        raise ModelDirError(f"{file}: {real.stat().st_size} bytes, more than a model.json "
                            f"holds (at most {MAX_MODEL_JSON_BYTES})")
    try:
        meta = json.loads(real.read_bytes())
    except (ValueError, RecursionError) as e:
        raise ModelDirError(f"{file}: not valid JSON ({printable(str(e), 200)})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelDirError(f"{file}: format is {quoted(got)}, expected {FORMAT_NAME!r}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelDirError(f"{file}: format_version {quoted(meta.get('format_version'))} "
                            f"is not supported (this recsync reads version {FORMAT_VERSION})")
    check_fields(meta, file)
    return meta


def member(root: Path, name, key: str) -> Path:
    """The file ``name`` (model.json's ``key``) of directory ``root``, resolved: a plain name
    that stays inside ``root`` after resolving symlinks, and no device or FIFO."""
    where = str(root / MODEL_JSON)
    try:
        return regular_file(inside(root, name, where=where, what=key, plain=True),
                            where=where, what=key)
    except UnsafeName as e:
        raise ModelDirError(str(e)) from None


def load_tensors(file: Path, real: Path | None = None) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (``real``: its resolved path, if already checked);
    ModelDirError naming ``file`` if it is missing or damaged."""
    real = file if real is None else real
    if not real.is_file():
        raise ModelDirError(f"{file}: missing (named by model.json)")
    try:
        return load_file(str(real))
    except (SafetensorError, OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"{file}: cannot be read as safetensors ({printable(first, 200)})"
                            ) from None


def check_finite(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """ModelDirError naming the file and tensor if a floating-point tensor holds NaN or inf:
    such a model would score every row NaN."""
    for key, value in tensors.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ModelDirError(f"{file}: tensor {quoted(key)} holds NaN or infinite values "
                                f"(the run diverged?); this model cannot score")


def read_model_dir(path: str | Path) -> ModelFiles:
    """Load a model directory; ModelDirError (one line, naming the file) if anything is
    missing, damaged or does not match model.json."""
    root = Path(path)
    meta = read_meta(root)
    dense_file = root / meta["dense"]["file"]
    dense = load_tensors(dense_file, member(root, meta["dense"]["file"], "dense.file"))
    params = sum(int(v.numel()) for v in dense.values())
    if params != meta["dense"]["parameters"]:
        raise ModelDirError(f"{dense_file}: {params} parameters, model.json says "
                            f"{meta['dense']['parameters']}")
    check_finite(dense, dense_file)
    tables = [_read_table(root, i, t) for i, t in enumerate(meta["tables"])]
    optimizer = None
    opt = meta.get("dense_optimizer")
    if opt is not None:
        opt_file = root / opt["file"]
        state = load_tensors(opt_file, member(root, opt["file"], "dense_optimizer.file"))
        check_finite(state, opt_file)
        scalars = opt.get("scalars", {})
        clash = state.keys() & scalars.keys()
        if clash:
            raise ModelDirError(f"{root / MODEL_JSON}: dense_optimizer.scalars repeat "
                                f"tensors of {opt_file.name}: {quoted(sorted(clash))}")
        state.update(scalars)
        optimizer = {"state": {0: state} if state else {}, "param_groups": opt["param_groups"]}
    return ModelFiles(root, meta, dense, tables, optimizer)


def _read_table(root: Path, index: int, t: dict):
    """Table ``index``'s tensors, checked against its model.json entry ``t`` (whose fields
    meta_fields.py checked)."""
    name, rows, dim, trained = quoted(t["name"]), t["rows"], t["dim"], t["trained_rows"]
    file = root / t["file"]
    arrays = load_tensors(file, member(root, t["file"], f"tables[{index}].file"))
    ids, values = arrays.get("ids"), arrays.get("rows")
    if ids is None or values is None:
        raise ModelDirError(f"{file}: must hold tensors 'ids' and 'rows', has "
                            f"{quoted(sorted(arrays))}")
    if ids.dtype != torch.int64 or ids.shape != (trained,):
        raise ModelDirError(f"{file}: ids are {ids.dtype} {list(ids.shape)}, model.json says "
                            f"int64 [{trained}] (table {name})")
    if values.dtype != torch.float32 or values.shape != (trained, dim):
        raise ModelDirError(f"{file}: rows are {values.dtype} {list(values.shape)}, model.json "
                            f"says float32 [{trained}, {dim}] (table {name})")
    if t["kind"] == "dynamic":  # any int64 id
        if trained and bool((ids[1:] <= ids[:-1]).any()):
            raise ModelDirError(f"{file}: ids must be ascending and unique (dynamic table "
                                f"{name})")
    elif trained and (int(ids[0]) < 0 or int(ids[-1]) >= rows
                      or bool((ids[1:] <= ids[:-1]).any())):
        raise ModelDirError(f"{file}: ids must be ascending, unique and in [0, {rows}) "
                            f"(table {name})")
    state = arrays.get("state")
    if state is not None:
        state_dim = t.get("state_dim", 0)
        if state.dtype != torch.float32 or state.shape != (trained, state_dim):
            raise ModelDirError(f"{file}: state is {state.dtype} {list(state.shape)}, "
                                f"model.json says float32 [{trained}, {state_dim}]")
    check_finite({k: v for k, v in (("rows", values), ("state", state)) if v is not None},
                 file)
    return ids, values, state
