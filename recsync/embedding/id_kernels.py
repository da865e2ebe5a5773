"""Compiled lookups of BucketIndex (bucket_index.py): the steady state of a dynamic table.

In numpy a lookup costs about ten vectorised passes over a call's ids, each with a fixed cost,
which made a dynamic table's pull 0.36x and its push 0.55x a fixed table's (issue 33's
``bench dynamic``). These loops do the same probe per id in one pass (numba, compiled on first
use and cached beside this file); ``find_touch`` also scores the rows it finds, so a pull
whose ids all hold rows is one pass and a gather. Inserts, removals and rebuilds stay
in numpy (bucket_index.py): they run at admission and eviction, not on every call.

The hash, bucket and fingerprint must be exactly BucketIndex._home's; tests/unit/test_id_map.py
checks the two against each other.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MUL = np.uint64(0x9E3779B97F4A7C15)
_S32 = np.uint64(32)
_EMPTY = -1
_COUNT_MAX = np.uint32(np.iinfo(np.uint32).max)


@njit(cache=True, nogil=True, inline="always")
def _probe(table, keys, slot_bits, fp_bits, key):
    """The slot of ``key`` (int64), or -1: BucketIndex.find for one id."""
    x = np.uint64(key)
    x = (x ^ (x >> _S32)) * _MUL
    top = x >> _S32
    num_buckets = table.shape[0]
    bucket = np.int64((top * np.uint64(num_buckets)) >> _S32)
    fp = np.int64(top & np.uint64((1 << fp_bits) - 1))
    slot_mask = (1 << slot_bits) - 1
    while True:
        stop = False
        for e in range(table.shape[1]):
            v = np.int64(table[bucket, e])
            if v == _EMPTY:
                stop = True
            elif v >= 0 and (v >> slot_bits) == fp:
                slot = v & slot_mask
                if keys[slot] == key:
                    return slot
        if stop:
            return -1
        bucket += 1
        if bucket == num_buckets:
            bucket = 0


@njit(cache=True, nogil=True)
def find(table, keys, slot_bits, fp_bits, ids, out):
    """``out[i]``: the slot of ``ids[i]``, -1 where absent (id 0 always: no key is 0)."""
    for i in range(ids.shape[0]):
        out[i] = _probe(table, keys, slot_bits, fp_bits, ids[i]) if ids[i] != 0 else -1


@njit(cache=True, nogil=True)
def find_touch(table, keys, slot_bits, fp_bits, ids, missing_key, count, last, now, out):
    """A pull's ``find``: ``out[i]`` the slot of ``ids[i]`` (id 0 looked up as
    ``missing_key``), -1 where absent, and one sighting of each row found (IdMap.touch: count
    + 1 saturating, last = ``now``; in the record the probe has just read). Returns how many
    are absent. The rows are gathered after, by torch (``index_select``), which measured
    faster than gathering them here."""
    absent = 0
    for i in range(ids.shape[0]):
        key = ids[i] if ids[i] != 0 else missing_key
        slot = _probe(table, keys, slot_bits, fp_bits, key) if key != 0 else -1
        out[i] = slot
        if slot < 0:
            absent += 1
        else:
            if count[slot] != _COUNT_MAX:
                count[slot] += np.uint32(1)
            last[slot] = now
    return absent
