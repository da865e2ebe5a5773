"""A model for a data set: the dense module, its tables and the plan of its lookups. Every
process that trains or scores (the local run, workers, the driver) builds it the same way."""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from recsync.embedding.lookup import LookupPlan
from recsync.embedding.spec import DynamicSpec, TableSpec
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
    tables = with_dynamic(tables, inputs, model_cfg)
    return BuiltModel(module, tables, LookupPlan(ds.layout.features, tables), inputs)


def with_dynamic(tables: list[TableSpec], inputs: ModelInputs, model_cfg) -> list[TableSpec]:
    """``tables`` with ``model.dynamic``'s settings on those that look up a dynamic data table
    (by their data table's name, so a model's second set of tables gets the same)."""
    dynamic = [d.name for d in inputs.tables if d.dynamic]
    for name in model_cfg.dynamic.tables:
        if name not in dynamic:
            raise ValueError(f"model.dynamic.tables.{name}: the data set has no dynamic table "
                             f"{name!r} (its dynamic tables: {', '.join(dynamic) or 'none'})")
    out = []
    for t in tables:
        if inputs.table(t.source).dynamic:
            d = model_cfg.dynamic.for_table(t.source)
            t = replace(t, dynamic=DynamicSpec(d.capacity, d.admit_after, d.eviction, d.ttl))
        out.append(t)
    return out
