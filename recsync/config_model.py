"""The model's config section (``[model]``) and its dynamic tables' (``[model.dynamic]``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from recsync.config_sections import MAX_LAYERS, MAX_WIDTH, Section, Width
from recsync.data.meta_checks import MAX_TABLE_ROWS

MAX_DYNAMIC_CAPACITY = 2**31 - 2  # IdMap's int32 slots
MAX_ADMIT_AFTER = 65_535  # admission's uint16 counters


class DynamicTableConfig(Section):
    capacity: int = Field(1_000_000, ge=1, le=MAX_DYNAMIC_CAPACITY)
    """rows a dynamic table holds per PS shard (the local run: in all); memory is checked for
    a full table at start-up"""
    admit_after: int = Field(1, ge=1, le=MAX_ADMIT_AFTER)
    """an id gets a row once it was seen in this many batches (1: at once); until then it
    reads zeros and its gradients are dropped"""
    eviction: Literal["lfu", "lru"] = "lfu"
    """when a shard's table is full, which rows make room: "lfu" the least often seen, "lru"
    the longest unseen"""
    ttl: int = Field(0, ge=0, lt=2**30)
    """rows unseen for this many updates of their table go (checked every ttl / 4 updates and
    at each checkpoint; 0: never)"""


class DynamicTableOverride(Section):
    """One table's own settings; a key left out is the section's."""
    capacity: int | None = Field(None, ge=1, le=MAX_DYNAMIC_CAPACITY)
    admit_after: int | None = Field(None, ge=1, le=MAX_ADMIT_AFTER)
    eviction: Literal["lfu", "lru"] | None = None
    ttl: int | None = Field(None, ge=0, lt=2**30)


class DynamicConfig(DynamicTableConfig):
    tables: dict[str, DynamicTableOverride] = {}
    """[model.dynamic.tables.NAME]: another capacity, admission, eviction or ttl for one table
    (keys left out are the section's)"""

    def for_table(self, name: str) -> DynamicTableConfig:
        """The settings of dynamic table ``name``: the section's, with its own on top."""
        own = self.tables.get(name)
        mine = own.model_dump(exclude_none=True) if own is not None else {}
        return DynamicTableConfig(**{**self.model_dump(exclude={"tables"}), **mine})


class ModelConfig(Section):
    name: str = "dlrm"
    """model: "dlrm" (DLRM, dot interaction), "dcn" (DCN-v2: cross network + deep MLP),
    "deepfm" (FM + deep MLP), "wide_deep" (Wide & Deep), "lr" (logistic regression), or your
    own builder, "package.module:builder" or "path/to/file.py:builder" (docs/models.md)"""
    embedding_dim: int = Field(16, ge=1, le=MAX_WIDTH)
    """width of every embedding row where the schema gives none (lr and the first-order tables
    of deepfm and wide_deep use 1)"""
    bottom_mlp: list[Width] = Field([512, 256, 64], max_length=MAX_LAYERS)
    """dlrm: hidden sizes of the bottom MLP over dense features (its output is embedding_dim
    wide)"""
    top_mlp: list[Width] = Field([512, 256], max_length=MAX_LAYERS)
    """dlrm: hidden sizes of the top MLP (its output is one logit)"""
    deep_mlp: list[Width] = Field([512, 256], max_length=MAX_LAYERS)
    """dcn, deepfm, wide_deep: hidden sizes of the deep MLP (its output is one logit). Every MLP:
    at most 64 layers, each 1 to 65536 wide (as embedding_dim)"""
    cross_layers: int = Field(3, ge=0, le=MAX_LAYERS)
    """dcn: full-rank cross layers x_{l+1} = x0 * (W x_l + b) + x_l"""
    dropout: float = Field(0.0, ge=0, lt=1)
    """dropout probability after every hidden layer of the built-in models' MLPs (0: off, the
    measured default, docs/models.md; > 0 makes sync differ from local by the dropout masks)"""
    params: dict[str, Any] = {}
    """[model.params]: keyword arguments of a user's builder (built-in models take none)"""
    table_rows: int = Field(0, ge=0, le=MAX_TABLE_ROWS)
    """rows of every embedding table (0: each table as large as the data set says)"""
    embedding_init_scale: float = Field(0.15, gt=0)
    """embedding rows start uniform in [-scale, scale)"""
    dynamic: DynamicConfig = DynamicConfig()
    """[model.dynamic]: rows per shard, admission and eviction of the data set's dynamic tables
    (a schema's `kind = "dynamic"`, docs/data.md); fixed tables ignore it"""
