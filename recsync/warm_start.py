"""``train.init_from``: a new run starts from a model directory (``OUT/model`` of an earlier
run): yesterday's model, today's data. The dense parameters, every row the earlier run trained
and, where it saved them (``output.save_optimizer_state``), the rows' and the dense optimizer's
state; rows it never trained start from this run's initial values, as any untouched row does.

The model must be the same (``model.*`` but dropout and embedding_init_scale, the tables' names
and dims, the dense parameters' names and shapes); a table may have grown (ids keep their
meaning). Anything else is refused in one line naming the key or table and both values.

Files (the model directory's layout, docs/serving.md): model.json, dense.safetensors,
table-NNN.safetensors (``ids`` ascending global ids, ``rows``, optionally ``state``),
dense_optimizer.safetensors. Loaded with safetensors only: nothing is unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from recsync.model.optim import make_dense_optimizer

# model keys that do not change the parameters' shapes or meaning
MODEL_KEYS_MAY_DIFFER = ("dropout", "embedding_init_scale")


@dataclass
class ModelFiles:
    """What a model directory holds (the fields of recsync.model_dir's ModelFiles):
    ``tables``: per table (ids int64 [n], rows float32 [n, dim], state float32 [n, state_dim]
    or None); ``dense_optimizer_state``: {"state": {0: flat tensors}, "param_groups"} or None."""

    path: Path
    meta: dict
    dense_state: dict[str, torch.Tensor]
    tables: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    dense_optimizer_state: dict | None


def read_model_files(path: str | Path) -> ModelFiles:
    """The model directory ``path``, read with safetensors; ValueError names the file.
    (recsync.model_dir.read_model_dir reads the same files with every check of the format;
    ``load_warm_start`` should use it.)"""
    root = Path(path)
    try:
        meta = json.loads((root / "model.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"train.init_from: {root / 'model.json'}: no such file (a model "
                         f"directory is a run's OUT/model)") from None
    except ValueError as e:
        raise ValueError(f"train.init_from: {root / 'model.json'}: not valid JSON ({e})"
                         ) from None
    if not isinstance(meta, dict) or meta.get("format") != "recsync-model":
        raise ValueError(f"train.init_from: {root / 'model.json'}: not a recsync model")
    dense = _tensors(root / meta["dense"]["file"])
    tables = []
    for t in meta["tables"]:
        arrays = _tensors(root / t["file"])
        tables.append((arrays["ids"], arrays["rows"], arrays.get("state")))
    optimizer = None
    if meta.get("optimizer_state"):
        opt = meta.get("dense_optimizer") or {}
        state = _tensors(root / opt.get("file", "dense_optimizer.safetensors"))
        state.update(opt.get("scalars") or {})
        optimizer = {"state": {0: state} if state else {},
                     "param_groups": opt.get("param_groups")}
    return ModelFiles(root, meta, dense, tables, optimizer)


def _tensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"train.init_from: {file}: cannot be read as safetensors "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                         ) from None


def load_warm_start(cfg, ds) -> ModelFiles:
    """``cfg.train.init_from`` read and checked against the model ``cfg`` builds for ``ds``."""
    from recsync.embedding.row_optim import make_row_optimizer
    from recsync.model.setup import model_for
    files = read_model_files(cfg.train.init_from)
    built = model_for(cfg.model, ds)
    t = cfg.train
    state_dim = make_row_optimizer(t.embedding_optimizer, t.embedding_lr).state_dim
    check_compatible(files, cfg, built.tables, built.module, state_dim)
    return files


def check_compatible(files: ModelFiles, cfg, tables, module: torch.nn.Module,
                     state_dim: int) -> None:
    """ValueError, one line naming the key or table and both values, unless ``files`` fits
    this run's model (``tables``: its TableSpecs, ``module``: its dense module,
    ``state_dim``: its row optimizer's)."""
    where = f"train.init_from = {str(files.path)!r}"
    saved, now = files.meta["model"], cfg.model.model_dump(mode="json")
    for key in sorted(saved.keys() & now.keys()):
        if key not in MODEL_KEYS_MAY_DIFFER and saved[key] != now[key]:
            raise ValueError(f"{where}: model.{key} is {json.dumps(saved[key])} in the model, "
                             f"{json.dumps(now[key])} in this run")
    names = [t["name"] for t in files.meta["tables"]]
    if names != [t.name for t in tables]:
        raise ValueError(f"{where}: the model's tables are {names}, this run's "
                         f"{[t.name for t in tables]}")
    for spec, entry, (ids, rows, state) in zip(tables, files.meta["tables"], files.tables):
        if rows.shape[1:] != (spec.dim,):
            raise ValueError(f"{where}: table {spec.name} has dim {rows.shape[1]} in the "
                             f"model, {spec.dim} in this run")
        if entry["rows"] > spec.rows:
            raise ValueError(f"{where}: table {spec.name} has {entry['rows']} rows in the "
                             f"model, {spec.rows} in this run")
        if state is not None and state.shape[1:] != (state_dim,):
            raise ValueError(
                f"{where}: table {spec.name}'s optimizer state has {state.shape[1]} values a "
                f"row in the model ({files.meta['train']['embedding_optimizer']}), this run's "
                f"train.embedding_optimizer = {cfg.train.embedding_optimizer!r} keeps "
                f"{state_dim}")
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in files.dense_state.items()}
    for key in sorted(expected.keys() | got.keys()):
        if expected.get(key) != got.get(key):
            raise ValueError(f"{where}: dense parameter {key} is {got.get(key)} in the model, "
                             f"{expected.get(key)} in this run")
    if files.dense_optimizer_state is not None:
        was = files.meta["train"]["dense_optimizer"]
        if was != cfg.train.dense_optimizer:
            raise ValueError(f"{where}: the model's dense optimizer state is {was!r}'s, this "
                             f"run's train.dense_optimizer = {cfg.train.dense_optimizer!r}")


def rows_snapshot(files: ModelFiles, shard: int, num_shards: int,
                  row_optimizer) -> dict[str, np.ndarray]:
    """The model's rows that shard ``shard`` of ``num_shards`` owns, as the arrays
    EmbeddingStore.restore takes (local index = id // num_shards); rows saved without their
    optimizer state get ``row_optimizer``'s initial state, as a fresh row does."""
    out = {}
    for t, (ids, rows, state) in enumerate(files.tables):
        mine = ids % num_shards == shard
        out[f"t{t}.local"] = (ids[mine] // num_shards).numpy()
        out[f"t{t}.weights"] = rows[mine].numpy()
        if state is None:
            out[f"t{t}.state"] = np.full((int(mine.sum()), row_optimizer.state_dim),
                                         row_optimizer.initial_state, np.float32)
        else:
            out[f"t{t}.state"] = state[mine].numpy()
    return out


def flat_optimizer_state(files: ModelFiles, cfg, numel: int) -> dict | None:
    """The dense optimizer's saved state over the flat vector of ``numel`` parameters
    (modes/handover.py's layout), with this run's hyper-parameters (its learning rate), or
    None if the model has none."""
    if files.dense_optimizer_state is None or not files.dense_optimizer_state["state"]:
        return None
    t = cfg.train
    fresh = make_dense_optimizer(t.dense_optimizer, [torch.zeros(numel, requires_grad=True)],
                                 t.dense_lr, t.dense_weight_decay)
    return {"state": {0: dict(files.dense_optimizer_state["state"][0])},
            "param_groups": fresh.state_dict()["param_groups"]}


def apply_local(model, files: ModelFiles, cfg) -> None:
    """The local run's model (local_run.LocalModel) takes the model's parameters and state."""
    from torch.nn.utils import parameters_to_vector

    from recsync.modes.handover import from_flat
    model.dense.load_state_dict(files.dense_state)
    store = model.lookup.store
    store.restore(rows_snapshot(files, 0, 1, store.optimizer))
    params = list(model.dense.parameters())
    flat = flat_optimizer_state(files, cfg, parameters_to_vector(params).numel())
    if flat is not None:
        model.dense_optimizer.load_state_dict(from_flat(flat, [p.shape for p in params]))
