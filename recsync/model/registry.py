"""Model name -> builder. A builder returns the dense module and the tables it looks up."""

from __future__ import annotations

from torch import nn

from recsync.embedding.spec import TableSpec
from recsync.model.dlrm import DLRM, LogisticRegression
from recsync.model.inputs import ModelInputs, feature_tables, slot_count


def build_dlrm(cfg, inputs: ModelInputs):
    tables = feature_tables(inputs, cfg.embedding_dim)
    return DLRM(inputs.num_dense, slot_count(inputs, tables), cfg.embedding_dim, cfg.bottom_mlp,
                cfg.top_mlp), tables


def build_lr(cfg, inputs: ModelInputs):
    tables = feature_tables(inputs, 1)
    return LogisticRegression(inputs.num_dense), tables


MODELS = {"dlrm": build_dlrm, "lr": build_lr}


def build_model(cfg, inputs: ModelInputs) -> tuple[nn.Module, list[TableSpec]]:
    """Build ``cfg.name`` (ModelConfig) for ``inputs``; ValueError lists valid names."""
    if cfg.name not in MODELS:
        raise ValueError(f"model.name: unknown model {cfg.name!r}; valid: {sorted(MODELS)}")
    return MODELS[cfg.name](cfg, inputs)
