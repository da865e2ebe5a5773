"""Many arrays as one on the direct data path (ps/channel.py): a list of arrays of one dtype
and row shape crosses as one array and the bounds of its parts, which the receiver slices
back into a list of views.

Why: pickle costs about 3 us per array on each side, and a call carries one array per table:
a pull's 26 arrays of ids cost 0.12 ms of encoding and decoding (0.03 ms as one array with its
join and split; `/work/probe41/enc.py`, 2026-11-28). The parts are joined by a copy up to
``JOIN_COPY_BYTES``; a pull's rows, which are parts of one gather already
(``EmbeddingStore.pull_arrays``' ``RowViews``), without one at any size.
"""

from __future__ import annotations

import itertools

import numpy as np

from recsync.embedding.store import RowViews

# a copy of this much (about 0.04 ms) costs less than pickling 26 parts apart (0.12 ms); a
# push's 3.4 MB of gradients at 2,048 ids is left as it is (where the two cross: not measured)
JOIN_COPY_BYTES = 1 << 20
DEPTH = 3  # how deep in tuples and lists a message's lists of arrays are looked for


class Joined:
    """A list of arrays as ``flat`` (the parts one after another) and ``bounds`` (where each
    begins and ends along the first axis); unpickles as the list of views of ``flat``."""

    __slots__ = ("flat", "bounds")

    def __init__(self, flat: np.ndarray, bounds: list[int]):
        self.flat, self.bounds = flat, bounds

    def __reduce__(self):
        return split, (self.flat, self.bounds)


def split(flat: np.ndarray, bounds: list[int]) -> list[np.ndarray]:
    return [flat[a:b] for a, b in zip(bounds, bounds[1:])]


def pack(obj, depth: int = DEPTH):
    """``obj`` with each list of arrays that ``join`` takes, within its tuples and lists down
    to ``depth``, a ``Joined``; the rest as it is."""
    if isinstance(obj, RowViews) and _still_views(obj):
        return Joined(obj.flat, obj.bounds)
    kind = type(obj)
    if isinstance(obj, list) and len(obj) > 1:
        joined = join(obj)
        if joined is not None:
            return joined
    if (kind is tuple or kind is list) and depth:
        return kind(pack(x, depth - 1) for x in obj)
    return obj


def _still_views(rows: RowViews) -> bool:
    """``rows`` are still the parts of ``rows.flat`` they were made as (nothing replaced one)."""
    flat, bounds = rows.flat, rows.bounds
    return (flat is not None and len(rows) == len(bounds) - 1
            and all(r.base is flat and len(r) == end - start
                    for r, start, end in zip(rows, bounds, bounds[1:])))


def join(arrays: list) -> Joined | None:
    """``arrays`` as one copy, if they are all arrays of one plain dtype and row shape, of
    ``JOIN_COPY_BYTES`` in all at most; else None."""
    first = arrays[0]
    if type(first) is not np.ndarray or first.ndim == 0 or first.dtype.hasobject:
        return None
    dtype, row_shape, total = first.dtype, first.shape[1:], 0
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype != dtype or a.shape[1:] != row_shape:
            return None
        total += a.nbytes
    if total > JOIN_COPY_BYTES:
        return None
    return Joined(np.concatenate(arrays), [0, *itertools.accumulate(len(a) for a in arrays)])
