"""``train.init_from``: a new run starts from a model directory (``OUT/model`` of an earlier
run): yesterday's model, today's data. The dense parameters, every row the earlier run trained
and, where it saved them (``output.save_optimizer_state``), the rows' and the dense optimizer's
state; rows it never trained start from this run's initial values, as any untouched row does.

The model must be the same (``model.*`` but dropout, embedding_init_scale and dynamic, the
tables' names and dims, the dense parameters' names and shapes); a table may have grown (ids
keep their meaning), and a dynamic table takes the earlier run's rows by id. Anything else is
refused in one line naming the key or table and both values.

The directory is read by recsync.model_dir.read (safetensors only: nothing is unpickled, every
model.json field checked). The model is built from this run's own config (``model.*``), never
from the directory's model.json: its ``model.name`` is only compared, never imported.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from recsync.model.optim import UPDATES, make_dense_optimizer
from recsync.model_dir.read import ModelDirError, ModelFiles, read_model_dir
from recsync.safe_names import printable

# model keys that do not change the parameters' shapes or meaning
MODEL_KEYS_MAY_DIFFER = ("dropout", "embedding_init_scale", "dynamic")


def load_warm_start(cfg, ds) -> ModelFiles:
    """``cfg.train.init_from`` read and checked against the model ``cfg`` builds for ``ds``."""
    from recsync.embedding.row_optim import make_row_optimizer
    from recsync.model.setup import model_for
    try:
        files = read_model_dir(cfg.train.init_from)
    except ModelDirError as e:
        raise ValueError(f"train.init_from: {e}") from None
    built = model_for(cfg.model, ds)
    t = cfg.train
    state_dim = make_row_optimizer(t.embedding_optimizer, t.embedding_lr).state_dim
    check_compatible(files, cfg, built.tables, built.module, state_dim,
                     shards=cfg.cluster.ps_shards if cfg.distributed else 1)
    return files


def check_compatible(files: ModelFiles, cfg, tables, module: torch.nn.Module,
                     state_dim: int, shards: int = 1) -> None:
    """ValueError, one line naming the key or table and both values, unless ``files`` fits
    this run's model (``tables``: its TableSpecs, ``module``: its dense module,
    ``state_dim``: its row optimizer's)."""
    where = f"train.init_from = {str(files.path)!r}"
    saved, now = files.meta["model"], cfg.model.model_dump(mode="json")
    for key in sorted(saved.keys() & now.keys()):
        if key not in MODEL_KEYS_MAY_DIFFER and saved[key] != now[key]:
            raise ValueError(f"{where}: model.{key} is {printable(json.dumps(saved[key]))} in "
                             f"the model, {printable(json.dumps(now[key]))} in this run")
    names = [t["name"] for t in files.meta["tables"]]
    if names != [t.name for t in tables]:
        raise ValueError(f"{where}: the model's tables are {printable(repr(names), 300)}, "
                         f"this run's {printable(repr([t.name for t in tables]), 300)}")
    for spec, entry, (ids, rows, state) in zip(tables, files.meta["tables"], files.tables):
        kind = "dynamic" if spec.dynamic is not None else "fixed"
        if entry.get("kind", "fixed") != kind:
            raise ValueError(f"{where}: table {spec.name} is {entry.get('kind', 'fixed')} in the "
                             f"model, {kind} in this run: its ids mean other values")
        if spec.dynamic is not None:
            held = np.bincount((ids % shards).numpy(), minlength=shards).max() if len(ids) else 0
            if held > spec.dynamic.capacity:
                raise ValueError(f"{where}: table {spec.name} has {len(ids):,} rows in the model, "
                                 f"{held:,} of them for one of this run's {shards} store(s), "
                                 f"over model.dynamic.capacity {spec.dynamic.capacity:,}")
        if rows.shape[1:] != (spec.dim,):
            raise ValueError(f"{where}: table {spec.name} has dim {rows.shape[1]} in the "
                             f"model, {spec.dim} in this run")
        if spec.dynamic is None and entry["rows"] > spec.rows:
            raise ValueError(f"{where}: table {spec.name} has {entry['rows']} rows in the "
                             f"model, {spec.rows} in this run")
        if state is not None and state.shape[1:] != (state_dim,):
            raise ValueError(
                f"{where}: table {spec.name}'s optimizer state has {state.shape[1]} values a "
                f"row in the model ({files.meta['train'].get('embedding_optimizer')}), this "
                f"run's train.embedding_optimizer = {cfg.train.embedding_optimizer!r} keeps "
                f"{state_dim}")
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in files.dense_state.items()}
    for key in sorted(expected.keys() | got.keys()):
        if expected.get(key) != got.get(key):
            raise ValueError(f"{where}: dense parameter {key} is {got.get(key)} in the model, "
                             f"{expected.get(key)} in this run")
    if files.dense_optimizer_state is not None:
        was = files.meta["train"].get("dense_optimizer")
        if was != cfg.train.dense_optimizer:
            raise ValueError(f"{where}: the model's dense optimizer state is {was!r}'s, this "
                             f"run's train.dense_optimizer = {cfg.train.dense_optimizer!r}")
        numel = sum(p.numel() for p in module.parameters())
        for key, value in files.dense_optimizer_state["state"].get(0, {}).items():
            if torch.is_tensor(value) and value.dim() and tuple(value.shape) != (numel,):
                raise ValueError(f"{where}: the dense optimizer's state {printable(repr(key))} "
                                 f"is {list(value.shape)}, this run's {numel} dense "
                                 f"parameters need [{numel}]")


def rows_snapshot(files: ModelFiles, shard: int, num_shards: int,
                  row_optimizer) -> dict[str, np.ndarray]:
    """The model's rows that shard ``shard`` of ``num_shards`` owns, as the arrays
    EmbeddingStore.restore takes (local index = id // num_shards, and the ids themselves for a
    dynamic table); rows saved without their
    optimizer state get ``row_optimizer``'s initial state, as a fresh row does."""
    out = {}
    for t, (ids, rows, state) in enumerate(files.tables):
        mine = ids % num_shards == shard
        out[f"t{t}.local"] = (ids[mine] // num_shards).numpy()
        out[f"t{t}.ids"] = ids[mine].numpy()  # what a dynamic table keys its rows by
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
    groups = fresh.state_dict()["param_groups"]
    # the updates the saved state has seen: its warm-up (train.dense_warmup_steps) is not redone
    groups[0][UPDATES] = files.dense_optimizer_state["param_groups"][0].get(UPDATES, 0)
    return {"state": {0: dict(files.dense_optimizer_state["state"][0])},
            "param_groups": groups}


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


def install(actors, model) -> None:
    """A distributed run's shards (``actors``: recsync.distributed.actors.RunActors) take
    ``model.warm`` (``model``: the driver's, recsync.distributed.driver_model), before
    training starts: every shard its rows, shard 0 the dense optimizer state where it holds
    the dense parameters."""
    import ray

    from recsync.embedding.row_optim import make_row_optimizer

    t = actors.cfg.train
    row_optimizer = make_row_optimizer(t.embedding_optimizer, t.embedding_lr)
    n = len(actors.shards)
    ray.get([s.warm_start.remote(rows_snapshot(model.warm, i, n, row_optimizer))
             for i, s in enumerate(actors.shards)])
    dense = model.initial_dense()
    flat = flat_optimizer_state(model.warm, actors.cfg, len(dense))
    if actors.facts.dense_on_ps and flat is not None:
        ray.get(actors.shards[0].install_dense.remote(
            dense, t.dense_optimizer, t.dense_lr, flat, t.dense_weight_decay,
            t.dense_warmup_steps))
