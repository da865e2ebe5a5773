"""Which shard owns an id, and where the row lives on that shard: pure functions.

Ids arriving here are already hashed (the Criteo converter hashes raw values; the synthetic
generator scatters popular ids with a random permutation), so plain modulo sharding spreads
both rows and load evenly. Local indices are dense (``id // num_shards``) so that a shard's
table has ``rows_on_shard`` rows and memory only for rows it owns.
"""

from __future__ import annotations

import torch


def shard_of(ids: torch.Tensor, num_shards: int) -> torch.Tensor:
    """Shard index of each id (int64 in, int64 out)."""
    return ids % num_shards


def local_index(ids: torch.Tensor, num_shards: int) -> torch.Tensor:
    """Row index of each id within its owning shard's table (``ids`` itself with one shard)."""
    return ids if num_shards == 1 else ids // num_shards


def rows_on_shard(rows: int, shard: int, num_shards: int) -> int:
    """How many of a table's ``rows`` ids belong to ``shard``."""
    return len(range(shard, rows, num_shards))


def split_by_shard(ids: torch.Tensor, num_shards: int) -> list[torch.Tensor]:
    """Positions into ``ids`` owned by each shard, in shard order.

    ``ids[positions[s]]`` are shard s's ids; writing results back to ``positions[s]`` restores
    the caller's order.
    """
    owner = shard_of(ids, num_shards)
    # one stable sort by owner instead of a scan per shard: the same ascending positions
    order = torch.argsort(owner, stable=True)
    return list(torch.split(order, torch.bincount(owner, minlength=num_shards).tolist()))
