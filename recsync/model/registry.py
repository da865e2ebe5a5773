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


def table_rows_for(model_cfg, data_rows: list[int]) -> list[int]:
    """Each table's rows: the data set's, or model.table_rows if set (never fewer than the
    data's)."""
    if model_cfg.table_rows == 0:
        return list(data_rows)
    if model_cfg.table_rows < max(data_rows):
        raise ValueError(f"model.table_rows = {model_cfg.table_rows} is smaller than the data "
                         f"set's largest table ({max(data_rows)} rows): ids would not fit")
    return [model_cfg.table_rows] * len(data_rows)


def build_model(cfg, num_dense: int, table_names: list[str],
                table_rows: list[int]) -> tuple[nn.Module, list[TableSpec]]:
    """Build ``cfg.name`` (ModelConfig) for a data set's tables; ValueError lists valid names."""
    if cfg.name not in MODELS:
        raise ValueError(f"model.name: unknown model {cfg.name!r}; valid: {sorted(MODELS)}")
    return MODELS[cfg.name](cfg, num_dense, table_names, table_rows)
