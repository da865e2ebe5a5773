"""BucketIndex: the hash index behind IdMap, open addressing over buckets of 8 int32 entries.

Why buckets: a bucket (8 entries, 32 bytes) is one memory access, and with at most half the
entries live it is rarely full (Poisson(4) >= 8: ~5% of buckets when the map is full, ~0.1% at
half load), so nearly every id is settled in its home bucket. Lookups (``find``, ``lookup``)
run compiled, an id at a time (id_kernels.py); inserts and removals, at admission and
eviction, run in numpy, where a fixed cost per operation makes rounds count: each round takes
every id's whole bucket at once and the few ids not settled go on, bucket by bucket (linear
probing), in later, much smaller rounds.

An entry is EMPTY (-1: unused since the last rebuild), TOMB (-2: its row was removed) or
``fingerprint << slot_bits | slot``, the fingerprint being hash bits of the id that the bucket
number does not use. A lookup reads the map's key only at entries whose fingerprint matches
(about one per present id), not at all 8, which saves most of the random reads into the keys.

A probe stops at the first bucket with an EMPTY entry. A removed entry becomes EMPTY again when
its bucket still has an EMPTY entry: such a bucket has never been full, so no key was ever
pushed past it and no probe needs to cross it. Only removals from full buckets leave
tombstones; the owner rebuilds the index when they pile up (``needs_rebuild``).
"""

from __future__ import annotations

import sys

import numpy as np

from recsync.embedding import id_kernels

BUCKET = 8
EMPTY, TOMB = -1, -2
_MUL = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, odd (Fibonacci hashing)
_S32 = np.uint64(32)


def num_buckets_for(capacity: int) -> int:
    """Buckets for a map of ``capacity`` slots: 2 entries per slot, so at most half are live."""
    return max(2, capacity // 4)


def _mix(ids: np.ndarray) -> np.ndarray:
    """64 hash bits of int64 ids: Fibonacci hashing with the high half folded in first, so
    every output bit from 32 up depends on all 64 input bits."""
    x = ids.view(np.uint64)
    return (x ^ (x >> _S32)) * _MUL


def _first_true(rows: np.ndarray) -> np.ndarray:
    """Column of the first True in each row of an (n, 8) bool array with a True in every row.

    argmax(axis=1) costs ~10 ns a row in numpy; reading a row's 8 bools as one little-endian
    uint64, its lowest set bit is 2**(8 * column), and a float64's exponent field holds log2.
    """
    if sys.byteorder != "little":
        return rows.argmax(axis=1)
    v = rows.view(np.uint64)[:, 0]
    low = v & (~v + np.uint64(1))
    return ((low.astype(np.float64).view(np.int64) >> 52) - 1023) >> 3


class BucketIndex:
    """Index from id to slot over ``keys`` (the map's id at each slot, owned by the caller;
    ``keys[slot]`` must hold the id for every indexed slot). Not thread-safe.
    """

    def __init__(self, keys: np.ndarray, capacity: int):
        self.keys = keys
        self.num_buckets = num_buckets_for(capacity)
        self.table = np.full((self.num_buckets, BUCKET), EMPTY, dtype=np.int32)
        self.slot_bits = max(1, (capacity - 1).bit_length())
        self.fp_bits = 31 - self.slot_bits  # 0 for the largest maps: every entry then matches
        self.num_tombs = 0
        # tombstones allowed before a rebuild: keeps live + tombs well below the entries, so
        # every probe meets an EMPTY entry and stops
        self.max_tombs = (self.table.size - capacity) // 2

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    @property
    def needs_rebuild(self) -> bool:
        """Too many tombstones: the owner should call ``rebuild`` with its live ids."""
        return self.num_tombs > self.max_tombs

    def _home(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Home bucket and fingerprint of each id, both from the top 32 hash bits: the bucket
        is their multiply-shift reduction (Lemire's fastrange: it follows their highest bits),
        the fingerprint their lowest ``fp_bits``, which vary within a bucket (a bucket spans
        2**32 / num_buckets = 2**34 / capacity values, 8 times 2**fp_bits)."""
        top = _mix(ids) >> _S32
        buckets = ((top * np.uint64(self.num_buckets)) >> _S32).view(np.int64)
        fp = (top & np.uint64((1 << self.fp_bits) - 1)).astype(np.int32)
        return buckets, fp

    def _next(self, buckets: np.ndarray) -> np.ndarray:
        buckets = buckets + 1
        buckets[buckets == self.num_buckets] = 0
        return buckets

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each int64 id (duplicates allowed), -1 where absent. Id 0 is always absent.
        One compiled pass (id_kernels.py)."""
        out = np.empty(len(ids), dtype=np.int64)
        id_kernels.find(self.table, self.keys, self.slot_bits, self.fp_bits,
                        np.ascontiguousarray(ids, dtype=np.int64), out)
        return out

    def find_touch(self, ids: np.ndarray, missing_key: int, count: np.ndarray,
                   last: np.ndarray, now: int) -> tuple[np.ndarray, int]:
        """``find`` of ids (id 0 looked up as ``missing_key``) and one sighting (count + 1
        saturating, last = ``now``) of each slot found: (slots, how many absent), in one
        compiled pass."""
        out = np.empty(len(ids), dtype=np.int64)
        absent = id_kernels.find_touch(self.table, self.keys, self.slot_bits, self.fp_bits,
                                       np.ascontiguousarray(ids, dtype=np.int64),
                                       np.int64(missing_key), count, last, np.int64(now), out)
        return out, int(absent)

    def place(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add entries for ids (unique, absent, nonzero: not checked) at ``slots``."""
        flat_table = self.table.reshape(-1)
        buckets, fp = self._home(ids)
        values = (fp << self.slot_bits) | slots.astype(np.int32)
        while len(values):
            entries = np.take(self.table, buckets, axis=0)
            free = entries < 0
            has_free = free.view(np.uint64)[:, 0] != 0
            cand = np.flatnonzero(has_free)
            target = buckets[cand] * BUCKET + _first_true(free[cand])
            # ids racing for one free entry all write it; the one whose write stuck wins
            was = flat_table[target] if self.num_tombs else None
            flat_table[target] = values[cand]
            won = flat_table[target] == values[cand]
            if was is not None:
                self.num_tombs -= int(np.count_nonzero(was[won] == TOMB))
            lost = np.ones(len(values), dtype=bool)
            lost[cand[won]] = False
            # a full bucket sends its ids on to the next bucket; losers retry the same one
            buckets = np.where(has_free, buckets, buckets + 1)
            buckets[buckets == self.num_buckets] = 0
            buckets, values = buckets[lost], values[lost]

    def drop(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Remove the entries of ids (indexed, unique: not checked) at ``slots``."""
        flat_table = self.table.reshape(-1)
        buckets, fp = self._home(ids)
        values = (fp << self.slot_bits) | slots.astype(np.int32)
        while len(values):
            entries = np.take(self.table, buckets, axis=0)
            hit = np.flatnonzero(entries == values[:, None])
            rows = hit >> 3
            has_empty = (entries == EMPTY).view(np.uint64)[:, 0] != 0
            reopen = has_empty[rows]
            flat_table[buckets[rows] * BUCKET + (hit & 7)] = np.where(reopen, EMPTY, TOMB)
            self.num_tombs += len(rows) - int(np.count_nonzero(reopen))
            go_on = np.ones(len(values), dtype=bool)
            go_on[rows] = False
            assert not has_empty[go_on].any(), "dropped an id that is not indexed"
            buckets, values = self._next(buckets[go_on]), values[go_on]

    def rebuild(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Forget every entry, then index exactly these ids at these slots."""
        self.table.fill(EMPTY)
        self.num_tombs = 0
        self.place(ids, slots)
