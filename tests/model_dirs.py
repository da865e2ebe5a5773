"""A model directory written by recsync's own writer (recsync/model_dir) from a local model,
for the tests of train.init_from."""

import torch

from recsync.data.reader import Dataset
from recsync.model_dir.state import local_state
from recsync.model_dir.write import write_model_dir as write


def write_model_dir(path, cfg, model, *, optimizer_state: bool = True) -> dict:
    """``model``: a local_run.LocalModel (trained a little), written as ``path`` (a directory
    named like a run's OUT/model). Returns what was written: per table (ids, rows, state),
    the dense state_dict and the flat dense optimizer state."""
    state = local_state(model, optimizer_state)
    write(path.parent, cfg, Dataset(cfg.data.path), state.tables, state.dense_state,
          state.trained, dense_optimizer=state.dense_optimizer, state_dim=state.state_dim,
          name=path.name)
    tables = [(torch.from_numpy(r.ids), torch.from_numpy(r.rows),
               None if r.state is None else torch.from_numpy(r.state)) for r in state.trained]
    dense = {k: v.detach().clone() for k, v in state.dense_state.items()}
    optimizer = state.dense_optimizer["state"][0] if optimizer_state else None
    return {"tables": tables, "dense": dense, "optimizer": optimizer}
