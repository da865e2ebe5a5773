"""A PS shard's core and its mode's rule, built from the run's config (inside the shard's
actor: Ray calls the builder again when it restarts a shard)."""

from __future__ import annotations

import functools

import numpy as np

from recsync.checkpoint.priority import MostUsed, SampledRows
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import TableSpec
from recsync.model.optim import import_optimizers
from recsync.ps.aggregation import as_tensor
from recsync.ps.core import DenseState, ShardCore


def make_rule(cfg, shard: int, dense_init: np.ndarray | None, mode: str):
    from recsync.modes import MODES
    return MODES[mode].make_rule(cfg, shard, dense_init)


def make_core(tables: list[TableSpec], cfg, shard: int, dense_init: np.ndarray | None,
              mode: str | None = None) -> ShardCore:
    """Shard ``shard``'s core for ``mode`` (default ``cfg.mode``); ``dense_init`` (given to
    shard 0 only) becomes its dense parameters where the mode keeps them on the PS (and is
    handed to the mode's rule, e.g. EASGD's center copy)."""
    from recsync.modes import MODES
    mode = mode or cfg.mode
    t, r = cfg.train, cfg.recovery
    dense = None
    if dense_init is not None and MODES[mode].holds_dense(cfg, shard):
        dense = DenseState(as_tensor(dense_init), t.dense_optimizer, t.dense_lr,
                           t.dense_weight_decay, t.dense_warmup_steps)
    elif dense_init is not None and cfg.switching.enabled:
        import_optimizers(t.dense_optimizer)  # shard 0 may take the dense state in a switch
    rules = functools.partial(make_rule, cfg, shard, dense_init)
    row_optimizer = make_row_optimizer(t.embedding_optimizer, t.embedding_lr,
                                       weight_decay=t.embedding_weight_decay)
    core = ShardCore(tables, row_optimizer,
                     shard=shard, num_shards=cfg.cluster.ps_shards, rule=rules(mode),
                     mode=mode, seed=t.seed, init_scale=cfg.model.embedding_init_scale,
                     dense=dense, full_every=r.full_every, make_rule=rules)
    if r.rows == "mfu":
        core.priority = MostUsed([len(w) for w in core.store.weights], r.mfu_fraction)
    elif r.rows == "ssu":
        core.priority = SampledRows(len(tables), r.ssu_max_rows)
    return core
