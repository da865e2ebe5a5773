"""IdMap: a dynamic table's map from 64-bit id to slot, with the per-row metadata for eviction.

A slot is the row number in the store's tensors of ``capacity`` rows (weights, optimizer
state), so a slot never moves while its id is live; removed slots are reused by later inserts.
Ids are any int64 bit pattern except 0, which means "missing" (a free slot holds id 0).

Memory per capacity row, all numpy, no Python object per row:
    key   int64   8   the id at each slot (0: free)
    count uint32  4   sightings since insert, saturating
    last  uint32  4   the ``now`` of the last insert or touch
    index int32   8   ~2 hash entries per slot (bucket_index.py)
    free  int32   4   stack of free slots
                 28   (bytes_per_row)

Key, count and last of a slot are one 16-byte record, so a lookup that reads the key and the
touch of a pull that writes count and last meet one cache line (id_kernels.py). ``now`` is the
caller's clock (a dynamic table's count of its updates), in [0, 2**32 - 1);
``shift_time`` moves every row's back when it grows near the top. A free slot's count and last
hold their largest values (LAST_FREE), so that scans of the metadata (``lowest``, ``idle``)
rank free slots after every live one and need not first gather the live slots. Not
thread-safe: one caller at a time.
"""

from __future__ import annotations

import numpy as np

from recsync.embedding.bucket_index import BUCKET, BucketIndex, num_buckets_for

COUNT_MAX = np.iinfo(np.uint32).max
LAST_FREE = np.iinfo(np.uint32).max  # a free slot's last; no ``now`` may reach it
_SAMPLE = 4096  # slots sampled by ``lowest`` to guess a score bound
POLICIES = ("lfu", "lru")


class MapFullError(RuntimeError):
    """An insert asked for more slots than the map has free; the map is unchanged."""


def as_ids(x) -> np.ndarray:
    """Ids as a 1-D int64 array; uint64 ids are reinterpreted (same 64 bits), not converted."""
    a = np.asarray(x)
    if a.dtype == np.uint64:
        return a.view(np.int64).reshape(-1)
    return np.asarray(a, dtype=np.int64).reshape(-1)


def _as_slots(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64).reshape(-1)


class IdMap:
    """int64 id -> slot in [0, capacity): bucketed open addressing over numpy arrays.

    Every method takes and returns 1-D numpy arrays (ids int64, slots int64).
    """

    def __init__(self, capacity: int):
        if not 1 <= capacity < 2**31 - 2:
            raise ValueError(f"capacity must be in [1, 2**31 - 2) (int32 slots), got {capacity}")
        self.capacity = capacity
        self._records = np.zeros((capacity, 2), dtype=np.int64)  # key, then count and last
        words = self._records.view(np.uint32)  # (capacity, 4): key's two halves, count, last
        self._keys, self._count, self._last = self._records[:, 0], words[:, 2], words[:, 3]
        self._count[:] = COUNT_MAX
        self._last[:] = LAST_FREE
        # free slots, popped from the top; reversed so a fresh map hands out 0, 1, 2, ...
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int32)
        self._num_free = capacity
        self._index = BucketIndex(self._keys, capacity)

    @staticmethod
    def bytes_per_row(capacity: int) -> float:
        """Metadata bytes per capacity row (keys, index, counts, last, free stack)."""
        per_slot = 16 + 4  # the record (key, count, last), the free stack
        return per_slot + num_buckets_for(capacity) * BUCKET * 4 / capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the map's arrays (independent of how many ids are live)."""
        return self._records.nbytes + self._free.nbytes + self._index.nbytes

    def __len__(self) -> int:
        return self.capacity - self._num_free

    def free(self) -> int:
        return self._num_free

    # ---- id <-> slot -------------------------------------------------------------------

    def find(self, ids) -> np.ndarray:
        """Slot of each id (duplicates allowed), -1 where absent (always for id 0)."""
        return self._index.find(as_ids(ids))

    def find_touch(self, ids, now: int, missing_key: int = 0) -> tuple[np.ndarray, int]:
        """A pull's lookup in one pass: ``find`` (id 0 looked up as ``missing_key``) and a
        ``touch`` of every slot found: (slots, how many ids are absent)."""
        _check_now(now)
        return self._index.find_touch(as_ids(ids), missing_key, self._count, self._last, now)

    def insert(self, ids, now: int = 0, *, check: bool = False) -> np.ndarray:
        """Give each id a free slot and return the slots (in the order of ``ids``).

        ``ids`` must be unique, absent from the map and nonzero. Id 0 is always checked (cheap);
        duplicates and ids already present are checked only with ``check=True`` (a sort and a
        find), otherwise they corrupt the map. The new rows get count 0 and last ``now``.
        Raises MapFullError, changing nothing, if there are more ids than free slots.
        """
        ids = as_ids(ids)
        n = len(ids)
        _check_now(now)
        if n > self._num_free:
            raise MapFullError(f"insert of {n} ids asked for {n} slots, {self._num_free} free "
                               f"(capacity {self.capacity}): remove rows first")
        if not n:
            return np.empty(0, dtype=np.int64)
        if not ids.all():
            raise ValueError("insert: id 0 means 'missing' and cannot be stored")
        if check:
            if _has_duplicates(ids):
                raise ValueError("insert: ids must be unique")
            present = self.find(ids) >= 0
            if present.any():
                raise ValueError(f"insert: {int(present.sum())} ids already present, "
                                 f"e.g. {int(ids[present][0])}")
        top = self._num_free
        slots = self._free[top - n:top][::-1].astype(np.int64)
        self._num_free = top - n
        self._keys[slots] = ids
        self._count[slots] = 0
        self._last[slots] = now
        self._index.place(ids, slots)
        return slots

    def remove(self, slots) -> None:
        """Free live ``slots`` (unique): their ids are no longer found, the slots get reused.

        Raises ValueError, changing nothing, on a slot out of range, free or repeated.
        """
        slots = self._checked_live(slots, "remove")
        if _has_duplicates(slots):
            raise ValueError("remove: slots must be unique")
        self._index.drop(self._keys[slots], slots)
        self._keys[slots] = 0
        self._count[slots] = COUNT_MAX
        self._last[slots] = LAST_FREE
        n = len(slots)
        self._free[self._num_free:self._num_free + n] = slots
        self._num_free += n
        if self._index.needs_rebuild:
            live = self.live_slots()
            self._index.rebuild(self._keys[live], live)

    def ids_of(self, slots) -> np.ndarray:
        """The id at each slot (in [0, capacity), else ValueError); 0 at a free slot."""
        return self._keys[self._checked_range(slots, "ids_of")]

    def live_slots(self) -> np.ndarray:
        """Every live slot, ascending (a scan of the capacity)."""
        return np.flatnonzero(self._keys)

    # ---- metadata and eviction -----------------------------------------------------------

    def touch(self, slots, now: int) -> None:
        """One sighting of each of ``slots`` (live; a slot listed twice counts twice): count
        += 1, saturating at 2**32 - 1, and last = ``now``."""
        slots = _as_slots(slots)
        _check_now(now)
        if not len(slots):
            return
        # np.add.at is the fast path; it wraps, so counts near the top go the slow way
        if int(self._count[slots].max()) > COUNT_MAX - len(slots):
            uniq, times = np.unique(slots, return_counts=True)
            total = self._count[uniq].astype(np.int64) + times
            self._count[uniq] = np.minimum(total, COUNT_MAX)
        else:
            np.add.at(self._count, slots, np.uint32(1))
        self._last[slots] = now

    def counts(self, slots) -> np.ndarray:
        """Sightings (uint32) at live slots since their insert (COUNT_MAX at a free slot)."""
        return self._count[self._checked_range(slots, "counts")]

    def last_seen(self, slots) -> np.ndarray:
        """``now`` (int64) of the last insert or touch of live slots (LAST_FREE at a free one)."""
        return self._last[self._checked_range(slots, "last_seen")].astype(np.int64)

    def shift_time(self, by: int) -> None:
        """Move every live row's last sighting ``by`` earlier (none before 0), as the caller
        moves its clock back by as much: ages (now - last) stay, except those over the new
        clock, which shrink to it (such rows stay the oldest)."""
        if by < 0:
            raise ValueError(f"shift_time: by must be >= 0, got {by}")
        live = self.live_slots()
        last = self._last[live].astype(np.int64)
        self._last[live] = np.maximum(last - by, 0)

    def lowest(self, k: int, policy: str) -> np.ndarray:
        """The ``k`` live slots with the lowest score, lowest first (all live if k > len).

        "lfu": by count, ties by older last; "lru": by last, ties by lower count; remaining
        ties by lower slot. Costs a few passes over the capacity plus a partition of the slots
        tied with the k-th (5-10 ms per million slots, most when many are tied): evict in
        batches, not a few rows per step.
        """
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        first, second = (self._count, self._last) if policy == "lfu" else (self._last,
                                                                           self._count)
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        cand = self._below_bound(first, k) if k < len(self) else self.live_slots()
        if k < len(cand):
            cand = cand[_k_smallest(first[cand], second[cand], k)]
        return cand[np.lexsort((cand, second[cand], first[cand]))]

    def _below_bound(self, first: np.ndarray, k: int) -> np.ndarray:
        """Slots whose ``first`` is at most a bound that at least k of them meet (so they hold
        the k lowest), ascending: the bound is guessed from a strided sample, with a margin,
        and if fewer than k meet it, every live slot is returned instead. Free slots rank last,
        and k < len(self), so no free slot is among the k lowest."""
        sample = np.sort(first[::max(1, self.capacity // _SAMPLE)])
        at = min(len(sample) - 1, 2 * (k * len(sample)) // self.capacity + 8)
        cand = np.flatnonzero(first <= sample[at])
        return cand if len(cand) >= k else self.live_slots()

    def idle(self, before: int) -> np.ndarray:
        """Live slots whose last sighting is older than ``before`` (last < before), ascending."""
        return np.flatnonzero(self._last < min(max(before, 0), LAST_FREE))

    # ---- checkpoints ---------------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray]:
        """The live rows in slot order: what a checkpoint saves (copies)."""
        live = self.live_slots()
        return {"slots": live, "ids": self._keys[live], "counts": self._count[live],
                "last": self._last[live].astype(np.int64)}

    def load(self, state: dict) -> None:
        """Hold exactly the rows of ``state`` (as from ``state()``), at the same slots.

        Raises ValueError naming the problem, changing nothing, on bad input.
        """
        slots, ids, count, last = _checked_state(state, self.capacity)
        self._keys[:] = 0
        self._count[:] = COUNT_MAX
        self._last[:] = LAST_FREE
        self._keys[slots] = ids
        self._count[slots] = count
        self._last[slots] = last
        free = np.flatnonzero(self._keys == 0)
        self._num_free = len(free)
        self._free[:len(free)] = free[::-1]
        self._index.rebuild(ids, slots)

    def _checked_range(self, slots, verb: str) -> np.ndarray:
        slots = _as_slots(slots)
        if len(slots) and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"{verb}: slots must be in [0, {self.capacity})")
        return slots

    def _checked_live(self, slots, verb: str) -> np.ndarray:
        slots = self._checked_range(slots, verb)
        if not self._keys[slots].all():
            raise ValueError(f"{verb}: slot {int(slots[self._keys[slots] == 0][0])} is free")
        return slots


def _check_now(now: int) -> None:
    if not 0 <= now < LAST_FREE:
        raise ValueError(f"now must be in [0, 2**32 - 1) (uint32, the top value marks a free "
                         f"slot), got {now}")


def _has_duplicates(a: np.ndarray) -> bool:
    # a sort: several times faster than np.unique (hash-based in numpy 2) on a few thousand
    s = np.sort(a)
    return bool((s[1:] == s[:-1]).any())


def _k_smallest(first: np.ndarray, second: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k smallest (first, second, position) triples, in no order."""
    if k == 0:
        return np.empty(0, dtype=np.int64)
    cut = np.partition(first, k - 1)[k - 1]
    below = np.flatnonzero(first < cut)
    tied = np.flatnonzero(first == cut)
    need = k - len(below)
    if need < len(tied):
        cut2 = np.partition(second[tied], need - 1)[need - 1]
        under = tied[second[tied] < cut2]
        # flatnonzero is ascending, so the first of the equal ones have the lowest positions
        level = tied[second[tied] == cut2][:need - len(under)]
        tied = np.concatenate([under, level])
    return np.concatenate([below, tied])


def _checked_state(state: dict, capacity: int):
    missing = [k for k in ("slots", "ids", "counts", "last") if k not in state]
    if missing:
        raise ValueError(f"IdMap state lacks {missing}")
    slots, ids = _as_slots(state["slots"]), as_ids(state["ids"])
    count = np.asarray(state["counts"]).reshape(-1)
    last = np.asarray(state["last"], dtype=np.int64).reshape(-1)
    sizes = {"slots": len(slots), "ids": len(ids), "counts": len(count), "last": len(last)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"IdMap state: lengths differ: {sizes}")
    if len(slots) and (slots.min() < 0 or slots.max() >= capacity):
        raise ValueError(f"IdMap state: slots must be in [0, {capacity}) (the map's capacity), "
                         f"got min {int(slots.min())}, max {int(slots.max())}")
    if _has_duplicates(slots):
        raise ValueError("IdMap state: duplicate slots")
    if _has_duplicates(ids):
        raise ValueError("IdMap state: duplicate ids")
    if not ids.all():
        raise ValueError("IdMap state: id 0 (means 'missing') cannot be stored")
    if len(count) and (count.min() < 0 or count.max() > COUNT_MAX):
        raise ValueError(f"IdMap state: counts must be in [0, {COUNT_MAX}]")
    if len(last) and (last.min() < 0 or last.max() >= LAST_FREE):
        raise ValueError("IdMap state: last must be in [0, 2**32 - 1) (the top value marks a "
                         "free slot)")
    return slots, ids, count.astype(np.uint32), last.astype(np.uint32)
