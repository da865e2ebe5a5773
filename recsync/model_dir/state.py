"""What a run hands the model directory at its end: the dense state, each table's trained rows
by global id (from the local store, or gathered from the PS shards), optionally the optimizer
state; and the write itself, timed, for summary.json."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsync.model_dir.write import TrainedRows, write_model_dir


@dataclass
class ModelState:
    tables: list  # the model's TableSpecs, in order
    dense_state: dict[str, torch.Tensor]
    trained: list[TrainedRows]
    dense_optimizer: dict | None  # flat layout (modes/handover.py), or None
    state_dim: int  # the row optimizer's


def store_rows(store, with_state: bool) -> list[TrainedRows]:
    """Each table's touched rows of an EmbeddingStore (a shard's or the local one's), keyed by
    global id (local index * num_shards + shard; a dynamic table's snapshot names its ids,
    in slot order: sorted here), ascending."""
    snap = store.snapshot(checkpoint=False)  # a reading: no expiry, tombstones kept
    out = []
    for t in range(len(store.tables)):
        rows, state = snap[f"t{t}.weights"], snap[f"t{t}.state"] if with_state else None
        if f"t{t}.ids" in snap:
            order = np.argsort(snap[f"t{t}.ids"], kind="stable")
            ids, rows = snap[f"t{t}.ids"][order], rows[order]
            state = None if state is None else state[order]
        else:
            ids = snap[f"t{t}.local"].astype(np.int64) * store.num_shards + store.shard
        out.append(TrainedRows(ids.astype(np.int64), rows, state))
    return out


def local_state(model, with_optimizer: bool) -> ModelState:
    """A local run's model (local_run.LocalModel): every row lives in its one store."""
    from recsync.modes.handover import to_flat
    store = model.lookup.store
    params = list(model.dense.parameters())
    optimizer = (to_flat(model.dense_optimizer.state_dict(), [p.shape for p in params])
                 if with_optimizer else None)
    return ModelState(store.tables, model.dense.state_dict(), store_rows(store, with_optimizer),
                      optimizer, store.optimizer.state_dim)


def save_model(out: Path, cfg, ds, state: ModelState, record, final_eval: dict | None,
               mode: str) -> dict | None:
    """Write OUT/model; summary.json's ``model`` ({"path", "bytes", "write_s"}), or None (and a
    warning) where it could not be written."""
    run = {"mode": mode, "samples": record.samples, "steps": record.steps,
           "eval": {k: v for k, v in (final_eval or {}).items()
                    if isinstance(v, (int, float)) and not (isinstance(v, float)
                                                            and math.isnan(v))}}
    try:
        return write_model_dir(out, cfg, ds, state.tables, state.dense_state, state.trained,
                               dense_optimizer=state.dense_optimizer, run=run,
                               state_dim=state.state_dim)
    except OSError as e:
        print(f"warning: could not write the model to {out / 'model'}: {e}", file=sys.stderr)
        return None
