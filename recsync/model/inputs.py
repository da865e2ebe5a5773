"""The model contract: what a model is built from and what its forward pass receives.

A builder gets ``ModelInputs`` (the data set's dense columns, sparse features and tables) and
returns the dense module and the embedding tables it looks up (``TableSpec``, each reading the
ids of one data table, ``TableSpec.source``). The module's forward pass is::

    forward(dense: Tensor [B, num_dense], embeddings: FeatureEmbeddings) -> logits [B]

``embeddings`` holds one tensor [B, dim] per *slot*: for each of the builder's tables in order,
one per feature that reads the table's source (in the data set's feature order). A multi-hot
feature's slot is its pooled (sum or mean) rows. With every table of one dim, the slots also come
stacked, [B, slots, dim], without a copy (``stack(embeddings)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recsync.embedding.spec import TableSpec


@dataclass(frozen=True)
class SparseFeature:
    """A sparse feature of the data set: ids into data table ``table``; ``pooling`` is None for
    one id per row, "sum" or "mean" for a multi-hot feature (several ids per row)."""

    name: str
    table: str
    pooling: str | None = None


@dataclass(frozen=True)
class DataTable:
    """A data table: the id space several features may share. ``dim`` is the schema's width for
    it, or None (then ``model.embedding_dim``). A fixed table's ids are in [0, rows). A
    ``dynamic`` table's ids are any int64 (the values' full 64-bit hashes, 0 missing) and
    ``rows`` is the size it is sized for (the schema's rows: what memory checks see), not a
    bound on its ids."""

    name: str
    rows: int
    dim: int | None = None
    dynamic: bool = False


@dataclass(frozen=True)
class ModelInputs:
    dense: tuple[str, ...]
    features: tuple[SparseFeature, ...]
    tables: tuple[DataTable, ...]
    embedding_dim: int = 16
    base_rate: float | None = None  # the training split's label mean, if known

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    def table(self, name: str) -> DataTable:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def used_tables(self) -> list[DataTable]:
        """The data tables some feature reads, in the order features first use them."""
        names = list(dict.fromkeys(f.table for f in self.features))
        return [self.table(n) for n in names]


def feature_tables(inputs: ModelInputs, dim: int | None = None,
                   suffix: str = "") -> list[TableSpec]:
    """One table per data table a feature reads: ``dim`` wide (None: the schema's dim, else
    ``inputs.embedding_dim``), named ``<data table><suffix>`` (a model that looks every feature
    up twice, e.g. a wide and a deep part, gives the second set a suffix)."""
    return [TableSpec(t.name + suffix, t.rows, dim or t.dim or inputs.embedding_dim,
                      source=t.name) for t in inputs.used_tables()]


def slot_count(inputs: ModelInputs, tables: list[TableSpec]) -> int:
    """How many embeddings a forward pass receives for ``tables``."""
    return sum(1 for t in tables for f in inputs.features if f.table == t.source)


def slot_dims(inputs: ModelInputs, tables: list[TableSpec]) -> list[int]:
    """The width of each embedding a forward pass receives for ``tables``, in slot order (their
    sum is the width of ``concat(embeddings)``)."""
    return [t.dim for t in tables for f in inputs.features if f.table == t.source]


class FeatureEmbeddings(tuple):
    """The slots' embeddings, a tuple of [B, dim] tensors; ``stacked`` is the same values as
    one [B, slots, dim] tensor when every slot has one dim, else None."""

    def __new__(cls, slots, stacked: torch.Tensor | None = None):
        self = super().__new__(cls, slots)
        self._stacked = stacked
        return self

    @classmethod
    def of(cls, stacked: torch.Tensor) -> "FeatureEmbeddings":
        """From a [B, slots, dim] tensor (views, no copy)."""
        return cls(stacked.unbind(1), stacked)

    @property
    def stacked(self) -> torch.Tensor | None:
        """[B, slots, dim] (a copy made on first use unless the slots came stacked), or None
        when the slots differ in dim."""
        if self._stacked is None and len(self) and len({int(e.shape[1]) for e in self}) == 1:
            self._stacked = torch.stack(list(self), dim=1)
        return self._stacked


def stack(embeddings) -> torch.Tensor:
    """The embeddings as one [B, slots, dim] tensor (no copy when they came stacked)."""
    stacked = getattr(embeddings, "stacked", None)
    if stacked is not None:
        return stacked
    if isinstance(embeddings, torch.Tensor):
        return embeddings
    dims = {int(e.shape[1]) for e in embeddings}  # int: a traced shape is a tensor (export)
    if len(dims) > 1:
        raise ValueError(f"this model needs every embedding to have one dim, got {sorted(dims)}"
                         f" (set one dim for every table in the schema)")
    return torch.stack(list(embeddings), dim=1)


def concat(embeddings) -> torch.Tensor:
    """The embeddings side by side, [B, Σ dim] (a copy)."""
    stacked = getattr(embeddings, "stacked", None)
    if stacked is not None:
        return stacked.reshape(stacked.shape[0], -1)
    if isinstance(embeddings, torch.Tensor):
        return embeddings.reshape(embeddings.shape[0], -1)
    return torch.cat(list(embeddings), dim=1)


def inputs_of(ds, model_cfg) -> ModelInputs:
    """A data set's (data/reader.py Dataset) inputs for ``model_cfg`` (ModelConfig): every
    table as large as the data set says, or ``model.table_rows`` if set (registry.py
    apply_table_rows: never fewer)."""
    from recsync.model.registry import apply_table_rows
    lay = ds.layout
    return apply_table_rows(model_cfg, ModelInputs(
        dense=tuple(lay.dense),
        features=tuple(SparseFeature(f.name, f.table, f.pooling) for f in lay.features),
        tables=tuple(DataTable(t.name, t.rows, t.dim, t.dynamic) for t in lay.tables),
        embedding_dim=model_cfg.embedding_dim, base_rate=ds.base_rate("train")))
