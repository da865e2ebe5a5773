"""Write a trained model as a directory (docs/serving.md): ``model.json``, ``dense.safetensors``
and one ``table-NNN.safetensors`` per table holding only the rows training touched, keyed by
global id (an untouched row is its deterministic initial value, so it costs nothing).

The directory is built beside its final name (``.model.tmp-PID``), every file fsynced, then
renamed into place; an older one is replaced only once the new one is complete, so a reader
sees the old model or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from recsync.checkpoint.files import fsync_path

FORMAT_NAME = "recsync-model"
FORMAT_VERSION = 1
MODEL_JSON = "model.json"
DENSE_FILE = "dense.safetensors"
DENSE_OPTIMIZER_FILE = "dense_optimizer.safetensors"


def table_file(index: int) -> str:
    return f"table-{index:03d}.safetensors"


@dataclass
class TrainedRows:
    """One table's rows that training touched: ``ids`` int64 [n] global, ascending; ``rows``
    float32 [n, dim]; ``state`` float32 [n, state_dim] (the row optimizer's) or None."""

    ids: np.ndarray
    rows: np.ndarray
    state: np.ndarray | None = None

    @classmethod
    def merged(cls, parts: list["TrainedRows"]) -> "TrainedRows":
        """The rows of several shards as one table, sorted by id."""
        ids = np.concatenate([p.ids for p in parts]).astype(np.int64, copy=False)
        order = np.argsort(ids, kind="stable")
        rows = np.concatenate([p.rows for p in parts])[order]
        states = [p.state for p in parts]
        state = None if any(s is None for s in states) else np.concatenate(states)[order]
        return cls(ids[order], rows, state)


def recsync_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("recsync")
    except PackageNotFoundError:
        return "unknown"


def data_section(ds) -> dict:
    """What scoring needs of the data set (its layout as in meta.json, its preprocessing)."""
    meta = ds.meta
    return {"format_version": meta["version"], "dense": list(meta["dense"]),
            "features": meta["features"], "tables": meta["tables"],
            "weight": bool(meta.get("weight", False)), "id_dtype": meta.get("id_dtype"),
            "base_rate": ds.base_rate("train"),
            "preprocessing": meta.get("preprocessing"), "source": meta.get("source")}


def model_meta(cfg, ds, tables, trained: list[TrainedRows], dense_params: int, *,
               state_dim: int, optimizer: dict | None, run: dict) -> dict:
    """model.json's content (``tables``: the model's TableSpecs, in order)."""
    t = cfg.train
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION,
        "recsync_version": recsync_version(),
        "model": cfg.model.model_dump(mode="json"),
        "train": {"seed": t.seed, "embedding_init_scale": cfg.model.embedding_init_scale,
                  "embedding_optimizer": t.embedding_optimizer, "embedding_lr": t.embedding_lr,
                  "dense_optimizer": t.dense_optimizer, "dense_lr": t.dense_lr,
                  "eval_batch_size": t.eval_batch_size},
        "data": data_section(ds),
        "tables": [{"name": s.name, "source": s.source, "rows": s.rows, "dim": s.dim,
                    "file": table_file(i), "trained_rows": int(len(r.ids)),
                    "state_dim": state_dim, **({"kind": "dynamic"} if s.dynamic else {})}
                   for i, (s, r) in enumerate(zip(tables, trained))],
        "dense": {"file": DENSE_FILE, "parameters": dense_params},
        "optimizer_state": optimizer is not None,
        "dense_optimizer": optimizer,
        "run": run,
    }


def write_model_dir(out_dir: str | Path, cfg, ds, tables, dense_state: dict,
                    trained: list[TrainedRows], *, dense_optimizer: dict | None = None,
                    run: dict | None = None, state_dim: int = 0,
                    name: str = "model") -> dict:
    """Write ``out_dir/name`` atomically; returns {"path", "bytes", "write_s"}.

    ``dense_state``: the dense module's state_dict; ``trained``: per table (the model's
    ``tables`` order) its touched rows; ``dense_optimizer``: the dense optimizer's state in the
    flat layout (modes/handover.py ``to_flat``) or None; ``state_dim``: the row optimizer's.
    """
    begin = time.perf_counter()
    out_dir = Path(out_dir)
    final = out_dir / name
    tmp = out_dir / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        params = sum(int(v.numel()) for v in dense_state.values())
        _save(tmp / DENSE_FILE, {k: v.detach().contiguous() for k, v in dense_state.items()})
        optimizer = None
        if dense_optimizer is not None:
            optimizer = _save_optimizer(tmp / DENSE_OPTIMIZER_FILE, dense_optimizer)
        for i, r in enumerate(trained):
            arrays = {"ids": torch.from_numpy(np.ascontiguousarray(r.ids, dtype=np.int64)),
                      "rows": torch.from_numpy(np.ascontiguousarray(r.rows, dtype=np.float32))}
            if r.state is not None:
                arrays["state"] = torch.from_numpy(np.ascontiguousarray(r.state,
                                                                        dtype=np.float32))
            _save(tmp / table_file(i), arrays)
        meta = model_meta(cfg, ds, tables, trained, params, state_dim=state_dim,
                          optimizer=optimizer, run=run or {})
        _write_text(tmp / MODEL_JSON, json.dumps(meta, indent=2) + "\n")
        fsync_path(tmp)
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in final.iterdir())
    return {"path": str(final), "bytes": size, "write_s": time.perf_counter() - begin}


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, str(path))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # as any file the run writes (safetensors makes it 0600)
    fsync_path(path)


def _save_optimizer(path: Path, flat: dict) -> dict:
    """The flat optimizer state's tensors to ``path``; returns what model.json says of it
    (its param_groups and any non-tensor state)."""
    state = flat["state"].get(0, {}) if flat["state"] else {}
    tensors = {k: v.detach().contiguous() for k, v in state.items() if torch.is_tensor(v)}
    _save(path, tensors)
    return {"file": DENSE_OPTIMIZER_FILE, "param_groups": flat["param_groups"],
            "scalars": {k: v for k, v in state.items() if not torch.is_tensor(v)}}


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved aside first and removed only
    after the new one is in place."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
