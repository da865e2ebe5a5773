"""Model name -> builder. A builder returns the dense module and the tables it looks up."""

from __future__ import annotations

from torch import nn

from recsync.embedding.spec import TableSpec
from recsync.model.dlrm import DLRM, LogisticRegression


def build_dlrm(cfg, num_dense: int, table_names: list[str], table_rows: list[int]):
    tables = [TableSpec(n, r, cfg.embedding_dim) for n, r in zip(table_names, table_rows)]
    return DLRM(num_dense, len(tables), cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp), tables


def build_lr(cfg, num_dense: int, table_names: list[str], table_rows: list[int]):
    tables = [TableSpec(n, r, 1) for n, r in zip(table_names, table_rows)]
    return LogisticRegression(num_dense), tables


MODELS = {"dlrm": build_dlrm, "lr": build_lr}


def build_model(cfg, num_dense: int, table_names: list[str],
                table_rows: list[int]) -> tuple[nn.Module, list[TableSpec]]:
    """Build ``cfg.name`` (ModelConfig) for a data set's tables; ValueError lists valid names."""
    if cfg.name not in MODELS:
        raise ValueError(f"model.name: unknown model {cfg.name!r}; valid: {sorted(MODELS)}")
    return MODELS[cfg.name](cfg, num_dense, table_names, table_rows)
