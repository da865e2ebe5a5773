"""A dynamic table's rows from a chain of checkpoints (a full one, then the partial ones after
it, CPR), resolved by id.

A dynamic table's saved rows are keyed by id (``t{t}.ids``); their local indices are slots,
which an eviction gives to another id, so they mean nothing across checkpoints. Each partial
checkpoint also names the ids evicted or expired since the checkpoint before it
(``t{t}.gone``, its tombstones). Resolving goes from the newest checkpoint back: an id takes
its newest save, unless a newer checkpoint tombstones it, in which case it is absent (it was
removed since, and its older save is stale). Within one checkpoint its rows win over its
tombstones: an id evicted and admitted again before the checkpoint began is a row of it.
"""

from __future__ import annotations

import numpy as np

PARTS = ("ids", "counts", "last", "weights", "state")


def resolve_dynamic(chain: list[dict[str, np.ndarray]], t: int) -> dict[str, np.ndarray]:
    """Table ``t``'s rows, ids, scores and clock (the last checkpoint's) as one full snapshot
    of ``chain`` (arrays, oldest first) would hold them, in slots 0, 1, ...; newest saves
    first."""
    decided = np.empty(0, np.int64)  # ids whose newest event (a save, a tombstone) was seen
    parts: dict[str, list[np.ndarray]] = {p: [] for p in PARTS}
    for k, arrays in enumerate(reversed(chain)):
        if f"t{t}.ids" not in arrays:
            raise ValueError(f"table {t} is dynamic, but checkpoint {len(chain) - 1 - k} of "
                             f"the chain has no ids for it (t{t}.ids): it was taken of a fixed "
                             f"table")
        ids = np.asarray(arrays[f"t{t}.ids"], np.int64)
        new = ~np.isin(ids, decided)
        for p in PARTS:
            parts[p].append(np.asarray(arrays[f"t{t}.{p}"])[new])
        gone = np.asarray(arrays.get(f"t{t}.gone", np.empty(0, np.int64)), np.int64)
        decided = np.union1d(decided, np.concatenate([ids, gone]))
    out = {f"t{t}.{p}": np.concatenate(chunks) for p, chunks in parts.items()}
    out[f"t{t}.local"] = np.arange(len(out[f"t{t}.ids"]), dtype=np.int64)
    out[f"t{t}.clock"] = np.array(int(chain[-1][f"t{t}.clock"]), np.int64)
    return out
