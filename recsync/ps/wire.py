"""What crosses between a worker's PS client and a shard: one buffer each way per call.

A call's per-table arrays (ids; rows or gradients) travel as one contiguous array, the offsets
of its tables in it and their row widths, so that Ray serialises one numpy array where it
serialised one per table (26 for Criteo), and the receiver reads each table's part as a view
of it, without a copy.
"""

from __future__ import annotations

import numpy as np

Packed = tuple  # (flat array, int64 offsets [tables + 1] in elements, row widths or None)


def pack(arrays: list[np.ndarray], dtype) -> Packed:
    """``arrays`` (1-D, or 2-D rows of a width per array) in one flat array of ``dtype``."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    flat = np.empty(int(offsets[-1]), dtype=dtype)
    for a, start, end in zip(arrays, offsets[:-1].tolist(), offsets[1:].tolist()):
        flat[start:end] = a.reshape(-1)
    widths = None if all(a.ndim == 1 for a in arrays) else [a.shape[1] for a in arrays]
    return flat, offsets, widths


def unpack(packed: Packed) -> list[np.ndarray]:
    """The arrays of :func:`pack`, as views of its flat array."""
    flat, offsets, widths = packed
    bounds = zip(offsets[:-1].tolist(), offsets[1:].tolist())
    if widths is None:
        return [flat[start:end] for start, end in bounds]
    return [flat[start:end].reshape(-1, w) for (start, end), w in zip(bounds, widths)]


def serve_pull(core, packed_ids: Packed) -> tuple[Packed, np.ndarray | None, int]:
    """A shard's answer to a pull: ``core.pull`` (ps/core.py ShardCore) of the packed ids,
    its rows packed."""
    rows, dense, version = core.pull(unpack(packed_ids))
    return pack(rows, np.float32), dense, version


def serve_push(core, packed_ids: Packed, packed_grads: Packed, dense_grad, meta: dict):
    """``core.push`` of a packed push."""
    return core.push(unpack(packed_ids), unpack(packed_grads), dense_grad, meta)
