"""How much memory embedding tables need, and a refusal before allocating tables that cannot fit.

Table sizes come from a data set's meta.json (or model.table_rows), so a crafted or mistyped
size must not turn into a 137 GB allocation: it is refused here, with the estimate, before any
tensor is made. The estimate is the memory of a table whose every row has been touched (the
store allocates lazily, so a run that touches few rows uses less); it is compared with the
machine's physical memory, the point past which the run cannot finish even in principle.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

FLOAT_BYTES = 4  # weights and row-optimizer state are float32
FLAG_BYTES = 1  # EmbeddingStore.initialized: one bool per row


class TableMemoryError(ValueError):
    """Embedding tables too large for this machine's memory; the message is one line."""


def table_bytes(table_rows: Sequence[int], dim: int, state_dim: int = 1) -> int:
    """Bytes of tables with ``table_rows`` rows each, every row touched: ``dim`` float32 values,
    ``state_dim`` float32 of row-optimizer state (0 for SGD, 1 for row-wise Adagrad) and the
    one-byte initialised flag per row."""
    return sum(table_rows) * ((dim + state_dim) * FLOAT_BYTES + FLAG_BYTES)


def physical_memory_bytes() -> int:
    """This machine's physical memory (bytes)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_table_memory(table_rows: Sequence[int], dim: int, *, state_dim: int = 1,
                       table_names: Sequence[str] | None = None,
                       limit_bytes: int | None = None, extra_bytes: int = 0) -> int:
    """Return :func:`table_bytes` of the tables, or raise TableMemoryError if it exceeds
    ``limit_bytes`` (default: this machine's physical memory).

    ``table_rows``: rows of each table held in one process (a PS shard passes its share);
    ``dim``: values per row (the widest table's); ``state_dim``: row-optimizer floats per row;
    ``table_names``: for the message (default C1, C2, ...); ``extra_bytes``: what the tables
    hold besides rows (dynamic tables' maps). Pure arithmetic: nothing is allocated, so callers
    may check before building anything.
    """
    need = table_bytes(table_rows, dim, state_dim) + extra_bytes
    limit = physical_memory_bytes() if limit_bytes is None else limit_bytes
    if need <= limit:
        return need
    names = list(table_names) if table_names else [f"C{i + 1}" for i in range(len(table_rows))]
    biggest = max(range(len(table_rows)), key=lambda i: table_rows[i])
    raise TableMemoryError(
        f"embedding tables need about {need / 1e9:,.1f} GB ({sum(table_rows):,} rows of {dim} "
        f"float32 values + {state_dim} of optimizer state), more than this machine's "
        f"{limit / 1e9:,.1f} GB of memory; the largest is {names[biggest]} with "
        f"{table_rows[biggest]:,} rows: lower the table sizes (the data set's meta.json "
        f"tables, set by `recsync data criteo --table-size`, or model.table_rows; a dynamic "
        f"table's model.dynamic.capacity)")
