"""TableSpec: the one place a table's shape is defined."""

from __future__ import annotations

from dataclasses import dataclass

from recsync.embedding.sharding import rows_on_shard

EVICTION_POLICIES = ("lfu", "lru")


@dataclass(frozen=True)
class DynamicSpec:
    """How a dynamic table holds its rows: keyed by the full 64-bit id in a map per shard of
    ``capacity`` rows (embedding/dynamic_table.py). An id gets a row after ``admit_after``
    sightings (pulls that carry it); when a shard's table is full the lowest-scored rows go
    (``eviction``: "lfu" by how often a row was pulled, "lru" by when); with ``ttl`` > 0, rows
    not pulled in the last ``ttl`` updates of the table go (checked every ttl / 4 updates and
    at each checkpoint)."""

    capacity: int
    admit_after: int = 1
    eviction: str = "lfu"
    ttl: int = 0

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"dynamic table capacity must be >= 1, got {self.capacity}")
        if self.admit_after < 1:
            raise ValueError(f"admit_after must be >= 1, got {self.admit_after}")
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got "
                             f"{self.eviction!r}")
        if not 0 <= self.ttl < 2**30:
            raise ValueError(f"ttl must be in [0, 2**30) updates, got {self.ttl}")


@dataclass(frozen=True)
class TableSpec:
    """An embedding table: ``rows`` ids (0 .. rows-1) of ``dim`` float32 values each, looked up
    with the ids of data table ``source`` (default: the table of the same name). A ``dynamic``
    table takes any int64 id instead and holds ``dynamic.capacity`` rows per shard; its
    ``rows`` is not used for ids."""

    name: str
    rows: int
    dim: int
    source: str = ""
    dynamic: DynamicSpec | None = None

    def __post_init__(self):
        if not self.source:
            object.__setattr__(self, "source", self.name)
        if self.rows < 1:
            raise ValueError(f"table {self.name}: rows must be >= 1, got {self.rows}")
        if self.dim < 1:
            raise ValueError(f"table {self.name}: dim must be >= 1, got {self.dim}")

    def rows_per_shard(self, shard: int, num_shards: int) -> int:
        """Rows this table holds on ``shard`` of ``num_shards``."""
        if self.dynamic is not None:
            return self.dynamic.capacity
        return rows_on_shard(self.rows, shard, num_shards)
