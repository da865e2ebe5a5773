"""TableSpec: the one place a table's shape is defined."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableSpec:
    """An embedding table: ``rows`` ids (0 .. rows-1) of ``dim`` float32 values each, looked up
    with the ids of data table ``source`` (default: the table of the same name)."""

    name: str
    rows: int
    dim: int
    source: str = ""

    def __post_init__(self):
        if not self.source:
            object.__setattr__(self, "source", self.name)
        if self.rows < 1:
            raise ValueError(f"table {self.name}: rows must be >= 1, got {self.rows}")
        if self.dim < 1:
            raise ValueError(f"table {self.name}: dim must be >= 1, got {self.dim}")
