"""A model for a data set: the dense module, its tables and the plan of its lookups. Every
process that trains or scores (the local run, workers, the driver) builds it the same way."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from recsync.embedding.lookup import LookupPlan
from recsync.embedding.spec import TableSpec
from recsync.model.inputs import ModelInputs, inputs_of
from recsync.model.registry import build_model


@dataclass
class BuiltModel:
    module: nn.Module
    tables: list[TableSpec]
    plan: LookupPlan
    inputs: ModelInputs


def model_for(model_cfg, ds, *, builder: str | None = None) -> BuiltModel:
    """Build ``model_cfg`` (ModelConfig) for data set ``ds``; ValueError names a bad key.
    ``builder``: a user's builder to use instead of ``model_cfg.name`` (registry.py)."""
    inputs = inputs_of(ds, model_cfg)
    module, tables = build_model(model_cfg, inputs, builder=builder)  # checks table sources
    return BuiltModel(module, tables, LookupPlan(ds.layout.features, tables), inputs)
