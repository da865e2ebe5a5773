"""The trained model of a distributed run, gathered from its PS shards for the model
directory (model_dir/state.py)."""

from __future__ import annotations

import ray

from recsync.embedding.row_optim import make_row_optimizer
from recsync.model_dir.state import ModelState
from recsync.model_dir.write import TrainedRows


def gathered_model_state(cfg, shards: list, model, worker_state: dict | None) -> ModelState:
    """The trained model as the model directory keeps it: the dense parameters (already in
    ``model.dense_model``, the driver's: driver_model.DriverModel), each table's rows gathered
    from every shard (``shards``: their handles) by global id, and with
    ``output.save_optimizer_state`` the rows' and the dense optimizer's state (shard 0's where
    it holds the dense parameters, else worker 0's: ``worker_state``)."""
    with_state = cfg.output.save_optimizer_state
    trained = gathered_rows(shards, len(model.tables), with_state)
    optimizer = None
    if with_state:
        optimizer = ray.get(shards[0].dense_optimizer_state.remote())
        if optimizer is None and worker_state is not None:
            optimizer = worker_state.get("optimizer")
    row_optimizer = make_row_optimizer(cfg.train.embedding_optimizer, cfg.train.embedding_lr)
    return ModelState(model.tables, model.dense_model.state_dict(), trained, optimizer,
                      row_optimizer.state_dim)


def gathered_rows(shards: list, num_tables: int, with_state: bool) -> list[TrainedRows]:
    """Each table's trained rows, gathered from every shard, by global id."""
    parts = ray.get([s.trained_rows.remote(with_state) for s in shards])
    return [TrainedRows.merged([p[t] for p in parts]) for t in range(num_tables)]
