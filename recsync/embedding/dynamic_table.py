"""DynamicTable: one dynamic table's rows on one store (the local run's, or a PS shard's).

Rows are keyed by the full 64-bit id in an IdMap (embedding/id_map.py) whose slots index the
weight and optimizer-state tensors of ``capacity`` rows, allocated once with ``torch.empty``
(untouched pages cost no memory). A pull is a sighting: it counts the ids for admission
(embedding/admission.py), gives a row to the ids admitted now (evicting the lowest-scored rows
when the table is full), and scores the rows it reads (LFU count, LRU clock). Ids without a row
read zeros and their gradients are dropped; both are counted. The clock is the table's own
count of pushes, so LRU age and ``ttl`` are measured in the table's updates. A full table
evicts a 64th of its rows at a time (finding the lowest scores reads every slot's). What admission
has counted of ids not yet admitted is not in checkpoints: after a restore they count anew.

Id 0 (a missing value) is kept under ``MISSING_KEY`` (2^63 - 1), as the map keeps no id 0: the
missing value has a row of its own, as in a fixed table (a value whose 64-bit hash is 2^63 - 1
shares it: one in 2^64).

Writes to a slot go through ``before_write`` of a copy in progress (embedding/rows_copy.py),
evictions included when the slot is given to another id, so a checkpoint holds every row, its
state and its id as they were when the copy began.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from recsync.embedding.admission import Admission
from recsync.embedding.id_map import IdMap

log = logging.getLogger(__name__)

MISSING_KEY = np.int64(np.iinfo(np.int64).max)  # where id 0 (missing) is kept in the map
EVICT_AT_ONCE = 1 / 64  # of the capacity: finding the lowest scores reads every slot's, so a
# full table makes room for many rows at once rather than a few each pull
SKETCH_ROWS_PER_CELL = 4  # admission's sketch: a counter per 4 rows of capacity in each of its
# 4 hash rows (2 bytes a row), halved after 10 x capacity sightings (TinyLFU's reset)

CLOCK_SHIFT_AT = 2**31  # the map keeps last sightings as uint32: at this clock every row's
# and the clock go back by half of it (IdMap.shift_time; ttl is below 2**30, so no row's age
# that matters changes)

STAT_KEYS = ("live", "admitted", "refused", "no_room", "evicted", "expired", "dropped_grads")


def sketch_width(capacity: int) -> int:
    return max(1024, capacity // SKETCH_ROWS_PER_CELL)


def metadata_bytes(spec) -> int:
    """Bytes a dynamic table holds besides its rows' weights, state and live flags: the map,
    and admission's sketch where it counts (admit_after > 1)."""
    d = spec.dynamic
    sketch = 2 * 4 * sketch_width(d.capacity) if d.admit_after > 1 else 0
    return int(IdMap.bytes_per_row(d.capacity) * d.capacity) + sketch


class DynamicTable:
    def __init__(self, spec, number: int, optimizer, *, seed: int, init_scale: float,
                 initial_rows):
        """``number``: the table's position in the store (part of its rows' initial values);
        ``initial_rows(seed, table, ids, dim, scale)``: the store's deterministic init."""
        d = spec.dynamic
        self.spec, self.number, self.optimizer = spec, number, optimizer
        self.seed, self.init_scale, self._initial_rows = seed, init_scale, initial_rows
        self.map = IdMap(d.capacity)
        self.admission = Admission(d.admit_after, width=sketch_width(d.capacity),
                                   seed=seed * 1_000_003 + number,
                                   decay_every=10 * d.capacity)
        self.weights = torch.empty(d.capacity, spec.dim)
        self.state = torch.empty(d.capacity, optimizer.state_dim)
        self.live = torch.zeros(d.capacity, dtype=torch.bool)  # the store's `initialized`
        self.clock = 0  # pushes applied to this table
        self.expired_at = 0  # the clock at the last expiry
        self.counts = dict.fromkeys(STAT_KEYS[1:], 0)
        self.removed: list[np.ndarray] | None = None  # ids removed since take_removed (if logged)
        self.on_remove = None  # called with the slots about to be freed

    def track_removals(self) -> None:
        """From now on, log the ids of the rows evicted or expired (``take_removed``)."""
        if self.removed is None:
            self.removed = []

    def take_removed(self) -> np.ndarray:
        """The ids (as the data gives them) removed since the last call, unique; the log
        starts again. Empty if removals are not tracked."""
        if not self.removed:
            return np.empty(0, np.int64)
        keys = np.unique(np.concatenate(self.removed))
        self.removed = []
        return np.where(keys == MISSING_KEY, 0, keys)

    # -- pull and push -----------------------------------------------------------------------
    def pull(self, ids: torch.Tensor, copying=None, admit: bool = True) -> torch.Tensor:
        """Rows of ``ids`` (int64, duplicates allowed) [n, dim] (a copy); zeros where an id
        has no row. ``admit``: a sighting (the module docstring); False: look up only (an
        evaluation's pull: no new row, no score changed)."""
        if admit:
            slots, absent = self.map.find_touch(ids.numpy(), self.clock, MISSING_KEY)
            if absent:
                slots = self._admit(ids, slots, copying)
        else:
            slots = self.map.find(keys_of(ids))
        slots = torch.from_numpy(slots)
        if len(slots) and int(slots.min()) >= 0:  # the steady state: every id holds a row
            return self.weights.index_select(0, slots)
        rows = self.weights.index_select(0, slots.clamp(min=0))
        rows[slots < 0] = 0.0
        return rows

    def _admit(self, ids: torch.Tensor, slots: np.ndarray, copying) -> np.ndarray:
        """After a pull found rows at ``slots`` (touched) and not for some ids: admit those
        seen often enough now; the slots of ``ids`` then, -1 where an id has no row. Rows this
        pull reads are never evicted by it."""
        found = slots[slots >= 0]
        keys = keys_of(ids)
        new = np.unique(keys[slots < 0])
        admitted = self.admission.admit(new)
        fresh = new[admitted]
        self.counts["refused"] += int(len(new) - len(fresh))
        if len(fresh) > self.map.free():
            self._make_room(len(fresh), keep=found)
        room = self.map.free()
        if len(fresh) > room:  # the missing value first, the rest in (pseudo-random) id order
            fresh = np.concatenate([fresh[fresh == MISSING_KEY], fresh[fresh != MISSING_KEY]])
            self.counts["no_room"] += len(fresh) - room
            fresh = fresh[:room]
        if len(fresh):
            self.counts["admitted"] += len(fresh)
            self.map.touch(self._insert(fresh, copying), self.clock)
            slots = self.map.find(keys)
        return slots

    def push(self, ids: torch.Tensor, grads: torch.Tensor, lr_scale: float,
             copying=None) -> None:
        """Apply the row optimizer to the rows of ``ids`` (unique) that still have one; the
        gradients of the others are dropped (counted)."""
        self.clock += 1
        if self.clock >= CLOCK_SHIFT_AT:
            self.shift_clock(CLOCK_SHIFT_AT // 2)
        ttl = self.spec.dynamic.ttl
        if ttl and self.clock - self.expired_at >= max(1, ttl // 4):
            self.expire()  # at a quarter of the ttl's pace: each expiry reads every slot
        slots = torch.from_numpy(self.map.find(keys_of(ids)))
        has = slots >= 0
        if not bool(has.all()):
            self.counts["dropped_grads"] += int((~has).sum())
            slots, grads = slots[has], grads[has]
        if len(slots):
            if copying is not None:
                copying.before_write(self.number, slots)
            self.optimizer.apply_to_table(self.weights, self.state, slots, grads, lr_scale)

    def shift_clock(self, by: int) -> None:
        """Move the clock and every row's last sighting ``by`` back (ages stay)."""
        self.map.shift_time(by)
        self.clock -= by
        self.expired_at = max(self.expired_at - by, 0)

    # -- admission and eviction --------------------------------------------------------------
    def _make_room(self, n: int, keep: np.ndarray) -> None:
        """Free up to ``n`` slots (a 64th of the capacity at least), evicting the lowest-scored
        rows, none of ``keep`` and none read since the table's last update: a row admitted for
        one worker's step is not taken by another worker's pull of the same step."""
        short = n - self.map.free()
        if short > 0:
            want = max(short, int(self.map.capacity * EVICT_AT_ONCE))
            k = want + len(keep)
            while True:  # rows read since the last update are skipped: look further if need be
                candidates = self.map.lowest(k, self.spec.dynamic.eviction)
                candidates = candidates[~np.isin(candidates, keep)]
                slots = candidates[self.map.last_seen(candidates) < self.clock][:want]
                if len(slots) == want or k >= len(self.map):
                    break
                k *= 4
            self._remove(slots)
            self.counts["evicted"] += len(slots)

    def _insert(self, keys: np.ndarray, copying) -> np.ndarray:
        """Give ``keys`` rows at their initial values; their slots."""
        placed = self.map.insert(keys, now=self.clock)
        slots = torch.from_numpy(placed)
        if copying is not None:  # a slot freed by an eviction may still be due in the copy
            copying.before_write(self.number, slots)
        ids = torch.from_numpy(np.where(keys == MISSING_KEY, 0, keys))
        self.weights.index_copy_(0, slots, self._initial_rows(
            self.seed, self.number, ids, self.spec.dim, self.init_scale))
        self.state.index_fill_(0, slots, self.optimizer.initial_state)
        self.live.index_fill_(0, slots, True)
        return placed

    def _remove(self, slots: np.ndarray) -> None:
        if len(slots):
            if self.removed is not None:
                self.removed.append(self.map.ids_of(slots).copy())
            if self.on_remove is not None:
                self.on_remove(torch.from_numpy(np.asarray(slots, np.int64)))
            self.map.remove(slots)
            self.live.index_fill_(0, torch.from_numpy(slots), False)

    def expire(self) -> int:
        """Remove the rows not pulled in the last ``ttl`` updates (none with ttl 0); how many."""
        ttl = self.spec.dynamic.ttl
        self.expired_at = self.clock
        if ttl <= 0 or self.clock < ttl:
            return 0
        slots = self.map.idle(self.clock - ttl)
        self._remove(slots)
        self.counts["expired"] += len(slots)
        return len(slots)

    # -- checkpoints -------------------------------------------------------------------------
    def ids_state(self) -> dict[str, np.ndarray]:
        """The map's live entries now (slots, ids, counts, last), with ids as the data gives
        them (id 0 for the missing value): what a copy beginning now will save with its rows."""
        state = {k: np.array(v) for k, v in self.map.state().items()}
        state["ids"] = np.where(state["ids"] == MISSING_KEY, 0, state["ids"])
        return state

    def restore(self, ids: np.ndarray, rows: torch.Tensor, state: torch.Tensor,
                counts: np.ndarray | None, last: np.ndarray | None, clock: int | None) -> None:
        """Hold exactly these rows (ids as the data gives them), in slots 0, 1, ...: a
        snapshot's slot numbers mean nothing once its rows are back."""
        name, n = self.spec.name, len(ids)
        if self.removed is not None:
            self.removed = []
        if n > self.map.capacity:
            if counts is None:
                raise ValueError(f"table {name}: {n} rows for this shard, more than its "
                                 f"capacity {self.map.capacity} (raise model.dynamic.capacity "
                                 f"or cluster.ps_shards)")
            # fewer shards than the checkpoint's: the best-scored rows stay, as if evicted
            policy = self.spec.dynamic.eviction
            order = (np.lexsort((-last, -counts)) if policy == "lfu"
                     else np.lexsort((-counts, -last)))[:self.map.capacity]
            log.warning("table %s: %d rows for this shard, capacity %d: the %d lowest-scored "
                        "(%s) are evicted", name, n, self.map.capacity, n - len(order), policy)
            self.counts["evicted"] += n - len(order)
            if self.removed is not None:  # not here, though the checkpoint chain has them
                self.removed = [keys_of(torch.from_numpy(np.delete(ids, order)))]
            keep = torch.from_numpy(order)
            ids, rows, state = ids[order], rows[keep], state[keep]
            counts, last, n = counts[order], last[order], len(order)
        zeros = np.zeros(n, np.int64)
        slots = np.arange(n, dtype=np.int64)
        self.map.load({"slots": slots, "ids": keys_of(torch.from_numpy(ids)),
                       "counts": zeros if counts is None else counts,
                       "last": zeros if last is None else last})
        t = torch.from_numpy(slots)
        self.live.fill_(False)
        self.weights.index_copy_(0, t, rows)
        self.state.index_copy_(0, t, state)
        self.live.index_fill_(0, t, True)
        if clock is None:  # a model directory's rows: no clock, no scores
            clock = int(last.max()) if last is not None and n else 0
        self.clock = clock

    def stats(self) -> dict:
        return {"live": len(self.map), "capacity": self.map.capacity, **self.counts}


def keys_of(ids: torch.Tensor) -> np.ndarray:
    """The map's keys of ``ids`` (int64): the ids, with 0 (missing) as ``MISSING_KEY``."""
    keys = ids.numpy()
    return np.where(keys == 0, MISSING_KEY, keys) if (keys == 0).any() else keys
