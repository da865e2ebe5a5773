"""Embedding lookups as the training step sees them: pull a batch's rows, push their gradients.

The step does not know where rows live. ``LocalLookup`` serves them from an in-process
EmbeddingStore (the single-process baseline); the parameter-server client of the distributed
runtime implements the same two calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recsync.embedding.store import EmbeddingStore


@dataclass
class PulledTable:
    """One table's part of a batch: unique ids, where each sample's id is among them, the rows."""

    ids: torch.Tensor       # int64 [u], unique
    inverse: torch.Tensor   # int64 [B]: sample i uses rows[inverse[i]]
    rows: torch.Tensor      # float32 [u, dim], a leaf that collects the row gradients


@dataclass
class PulledBatch:
    tables: list[PulledTable]

    def embeddings(self) -> list[torch.Tensor]:
        """Per-table [B, dim] inputs for the model; gradients flow back into each ``rows``."""
        return [t.rows.index_select(0, t.inverse) for t in self.tables]


def dedup(sparse: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per table (column of ``sparse`` [B, T]): (unique ids, inverse indices)."""
    return [torch.unique(sparse[:, t], return_inverse=True) for t in range(sparse.shape[1])]


class LocalLookup:
    """Pulls from and pushes to an EmbeddingStore in this process. Blocking, not thread-safe."""

    def __init__(self, store: EmbeddingStore):
        self.store = store

    def pull(self, sparse: torch.Tensor) -> PulledBatch:
        """Rows for a batch's ids (int64 [B, T]); each table's ids are deduplicated first."""
        tables = []
        for t, (ids, inverse) in enumerate(dedup(sparse)):
            rows = self.store.pull(t, ids).requires_grad_(True)
            tables.append(PulledTable(ids, inverse, rows))
        return PulledBatch(tables)

    def push(self, pulled: PulledBatch) -> None:
        """Apply the row gradients collected by ``pulled`` after ``loss.backward()``."""
        for t, table in enumerate(pulled.tables):
            if table.rows.grad is not None:
                self.store.push(t, table.ids, table.rows.grad)
