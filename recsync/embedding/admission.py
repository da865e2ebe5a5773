"""Admission: a dynamic table admits an id only after it has been seen ``admit_after`` times.

The sightings of ids not yet admitted are counted in a count-min sketch: ``depth`` rows of
``width`` uint16 counters, each row indexed by its own hash of the id (splitmix64 of the id
xor a per-row key). Memory is fixed (2 * width * depth bytes), however many ids go by.

An id's estimate is the smallest of its ``depth`` counters. Updates are conservative: each of
the id's counters is raised to (estimate + 1) if it is lower, never beyond. The estimate so
never undercounts an id's sightings (count-min's guarantee, kept by the conservative update),
but it overcounts when every one of the id's counters is shared with other ids (a hash
collision in each row), so such an id may be admitted early. That is the price of bounded
memory; a wider sketch makes it rarer.

Counters only grow: over a long run more and more cells fill up and collisions admit ids ever
earlier. ``decay()`` halves every counter (TinyLFU's reset), so what counts is recent
sightings; ``decay_every`` calls it after that many sightings. There is no per-id ``forget``:
lowering one id's counters would lower the counters it shares with others, and the sketch
would then undercount them.
"""

from __future__ import annotations

import numpy as np

from recsync.data.hashing import splitmix64
from recsync.embedding.id_map import as_ids

COUNTER_MAX = np.iinfo(np.uint16).max
_S32 = np.uint64(32)


class Admission:
    """Counts sightings of ids and says which have been seen ``admit_after`` times.

    ``admit_after <= 1`` admits every id and holds no sketch. Not thread-safe.
    """

    def __init__(self, admit_after: int, width: int = 1 << 20, depth: int = 4, seed: int = 0,
                 *, decay_every: int = 0):
        if not admit_after <= COUNTER_MAX:
            raise ValueError(f"admit_after must be <= {COUNTER_MAX} (uint16 counters), "
                             f"got {admit_after}")
        if not 1 <= width < 2**32:
            raise ValueError(f"width must be in [1, 2**32), got {width}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if decay_every < 0:
            raise ValueError(f"decay_every must be >= 0 (0: never), got {decay_every}")
        self.admit_after, self.width, self.depth, self.seed = admit_after, width, depth, seed
        self.decay_every = decay_every
        self.num_admitted = 0
        self.num_refused = 0
        self._since_decay = 0
        counting = admit_after > 1
        self._counters = np.zeros(depth * width if counting else 0, dtype=np.uint16)
        row_keys = np.arange(depth, dtype=np.uint64) + np.uint64((seed * depth) % 2**64)
        self._row_keys = splitmix64(row_keys)[:, None]
        self._row_base = (np.arange(depth, dtype=np.int64) * width)[:, None]

    @property
    def nbytes(self) -> int:
        return self._counters.nbytes

    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """(depth, len(ids)) positions in the flat counters: row r's hash, reduced to [0, width)
        by multiply-shift (Lemire's fastrange)."""
        h = splitmix64(ids.view(np.uint64)[None, :] ^ self._row_keys)
        col = ((h >> _S32) * np.uint64(self.width)) >> _S32
        return col.view(np.int64) + self._row_base

    def estimate(self, ids) -> np.ndarray:
        """Sightings counted for each id (int64), never fewer than the true number since the
        last decay. Read-only. All zeros when the sketch is off (admit_after <= 1)."""
        ids = as_ids(ids)
        if not self._counters.size:
            return np.zeros(len(ids), dtype=np.int64)
        return self._counters[self._cells(ids)].min(axis=0).astype(np.int64)

    def admit(self, ids) -> np.ndarray:
        """Count one sighting of each id (int64, meant unique within a call: an id listed
        twice is counted once) and return a bool mask: True where the id has now been seen at
        least ``admit_after`` times (by the sketch's estimate).

        Pass only ids that are not in the table yet: admitted ids are not removed from the
        sketch (see the module docstring).
        """
        ids = as_ids(ids)
        if not self._counters.size:
            self.num_admitted += len(ids)
            return np.ones(len(ids), dtype=bool)
        cells = self._cells(ids)
        new = np.minimum(self._counters[cells].min(axis=0).astype(np.int32) + 1, COUNTER_MAX)
        # maximum.at, not fancy assignment: ids colliding in a cell in this call must leave
        # the larger value there, or the other id would be undercounted
        np.maximum.at(self._counters, cells.reshape(-1),
                      np.broadcast_to(new.astype(np.uint16), cells.shape).reshape(-1))
        admitted = new >= self.admit_after
        num = int(np.count_nonzero(admitted))
        self.num_admitted += num
        self.num_refused += len(ids) - num
        self._since_decay += len(ids)
        if self.decay_every and self._since_decay >= self.decay_every:
            self.decay()
        return admitted

    def decay(self) -> None:
        """Halve every counter (rounding down): old sightings weigh half."""
        self._counters >>= 1
        self._since_decay = 0

    def state(self) -> dict[str, np.ndarray]:
        """Counters and tallies (copies): what a checkpoint saves."""
        return {"counters": self._counters.copy(),
                "config": np.array([self.admit_after, self.width, self.depth, self.seed]),
                "tallies": np.array([self.num_admitted, self.num_refused, self._since_decay])}

    def load(self, state: dict) -> None:
        """Take the counters and tallies of ``state()``; ValueError, changing nothing, if they
        come from a sketch of another shape, seed or admit_after."""
        missing = [k for k in ("counters", "config", "tallies") if k not in state]
        if missing:
            raise ValueError(f"Admission state lacks {missing}")
        config = [int(v) for v in np.asarray(state["config"]).reshape(-1)]
        mine = [self.admit_after, self.width, self.depth, self.seed]
        if config != mine:
            raise ValueError(f"Admission state is of a sketch with (admit_after, width, depth, "
                             f"seed) = {config}, this one has {mine}")
        counters = np.asarray(state["counters"])
        if counters.dtype != np.uint16 or counters.shape != self._counters.shape:
            raise ValueError(f"Admission state: counters must be uint16 of shape "
                             f"{self._counters.shape}, got {counters.dtype} {counters.shape}")
        tallies = [int(v) for v in np.asarray(state["tallies"]).reshape(-1)]
        if len(tallies) != 3 or min(tallies) < 0:
            raise ValueError(f"Admission state: tallies must be 3 counts >= 0, got {tallies}")
        self._counters[:] = counters
        self.num_admitted, self.num_refused, self._since_decay = tallies
