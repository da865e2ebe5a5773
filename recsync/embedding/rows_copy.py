"""RowsCopy: a consistent copy of an EmbeddingStore's touched rows, taken on a thread while the
store goes on serving (copy-on-write; docs/recovery.md "What a checkpoint blocks").

The rows to save are fixed when the copy begins: every touched row, or those a CPR priority
chooses from what it counted until then (``choose``: the choosing runs on the thread too, and
until it has run every touched row is kept as it was). A thread copies them slice by slice;
a push that is about to change a row not copied yet saves that row's old value first
(``before_write``, called by the store). So the copy holds every row as it was when the copy
began, whatever was pushed meanwhile, and the store's caller is held only while a slice is
copied or a pushed row is saved, never for the whole copy.
Rows first touched after the copy began are not in it: they were at their initial values then,
which a restore gives them again. Each row saved is written into its place in arrays allocated
once per table (in ascending row order, no sort): the copy takes its rows' bytes once.

A dynamic table's rows are its slots; the copy begins by expiring its idle rows (``ttl``) and
taking the map's entries (slot -> id, scores), so each saved row comes with the id it had when
the copy began, also where an eviction gave its slot to another id meanwhile (the store calls
``before_write`` for a slot before it reuses it). A partial copy (CPR) also holds, as
``t{t}.gone``, the ids the table evicted or expired since the previous copy began (its
tombstones, where the table logs them: DynamicTable.track_removals), so that restoring the
chain removes them rather than bring back their older saves.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

SLICE_ROWS = 8192  # rows looked at per hold of the lock: about a millisecond at dim 16


class RowsCopy:
    def __init__(self, store, rows: list[torch.Tensor] | None = None, choose=None, *,
                 checkpoint: bool = True):
        """The rows to save: every touched row of ``store``, or only these local indices per
        table (those of them that were touched), or those that ``choose()`` returns (local
        indices per table) when ``run`` calls it. Cheap: a mask per table; the thread finds
        the rows in it slice by slice. ``checkpoint``: a checkpoint round's copy, which expires
        dynamic tables' idle rows first and takes the ids removed since the previous one (its
        tombstones); False: a reading (an evaluation's or a model's), which changes nothing."""
        if rows is not None and choose is not None:
            raise ValueError("rows or choose, not both")
        self.store, self.choose = store, choose
        if checkpoint:
            store.expire_idle()  # a dynamic table's rows idle for longer than its ttl
        self.maps = {t: (table.ids_state(), table.clock) for t, table in store.dynamic.items()}
        # the ids removed since the previous checkpoint's copy began: a partial copy's tombstones
        self.removed = {t: table.take_removed() if checkpoint else np.empty(0, np.int64)
                        for t, table in store.dynamic.items()}
        self.partial = rows is not None or choose is not None
        self.chosen: list[torch.Tensor] | None = None  # what choose() returned
        self.keep: list[torch.Tensor | None] = [None for _ in store.initialized]
        self.lock = threading.Lock()
        self.pending = []
        for t, init in enumerate(store.initialized):
            if rows is None:
                pending = init.clone()
            else:
                pending = torch.zeros_like(init)
                pending.index_fill_(0, rows[t][init.index_select(0, rows[t])], True)
            self.pending.append(pending)
        # per table, from its first row saved: the rows the copy holds (local indices,
        # ascending) and their weights and state, each row written into its place
        self.out: list[tuple | None] = [None for _ in self.pending]
        self.rows = 0  # rows saved (known once ``run`` has run)
        self.held_s = 0.0  # time writers waited for the copy (the lock, saving old rows)
        self.saved_early = 0  # rows saved by a writer before the thread reached them
        self.copy_s = 0.0  # the thread's time from start to the last slice

    def _held(self, table: int) -> tuple:
        """(rows, weights, state) of ``table``'s copy, allocated at its first row saved: what
        is pending then is every row it will hold (pending only shrinks), ascending."""
        if self.out[table] is None:
            rows = self.pending[table].nonzero().squeeze(1)
            w, s = self.store.weights[table], self.store.state[table]
            self.out[table] = (rows, torch.empty((len(rows), w.shape[1]), dtype=w.dtype),
                               torch.empty((len(rows), s.shape[1]), dtype=s.dtype))
        return self.out[table]

    def _take(self, table: int, local: torch.Tensor) -> int:
        """Save rows ``local`` of ``table`` (pending ones; the lock is held) into their places."""
        if len(local):
            rows, weights, state = self._held(table)
            at = torch.searchsorted(rows, local)
            weights[at] = self.store.weights[table].index_select(0, local)
            state[at] = self.store.state[table].index_select(0, local)
            self.pending[table].index_fill_(0, local, False)
        return len(local)

    def before_write(self, table: int, local: torch.Tensor) -> None:
        """The store is about to change rows ``local`` of ``table``: save those the copy still
        needs as they are now."""
        begin = time.perf_counter()
        with self.lock:
            pending = self.pending[table]
            self.saved_early += self._take(table, local[pending.index_select(0, local)])
        self.held_s += time.perf_counter() - begin

    def _chosen(self, chosen: list[torch.Tensor]) -> None:
        """Only the rows chosen are copied from now on (those saved early are filtered at the
        end)."""
        self.chosen = chosen
        with self.lock:
            for t, rows in enumerate(chosen):
                keep = torch.zeros_like(self.pending[t])
                keep.index_fill_(0, rows, True)
                self.pending[t] &= keep
                self.keep[t] = keep
        time.sleep(0)

    def run(self) -> dict[str, np.ndarray]:
        """Copy what is left (on any thread) and detach from the store; returns the arrays
        ``EmbeddingStore.snapshot`` returns: per table its rows' local indices (ascending),
        weights and optimizer state."""
        begin = time.perf_counter()
        try:
            if self.choose is not None:
                self._chosen(self.choose())
            for t, pending in enumerate(self.pending):
                for start in range(0, len(pending), SLICE_ROWS):
                    with self.lock:
                        block = pending[start:start + SLICE_ROWS]
                        self._take(t, block.nonzero().squeeze(1) + start)
                    time.sleep(0)  # a writer waiting for the lock gets it now (it is not fair)
        finally:
            with self.lock:
                if self.store.copying is self:
                    self.store.copying = None
        out = {}
        for t in range(len(self.pending)):
            rows, weights, state = self._held(t)  # nothing pending now: empty if not yet made
            self.out[t] = None
            if self.keep[t] is not None:  # rows saved before the choice that were not chosen
                kept = self.keep[t].index_select(0, rows)
                rows, weights, state = rows[kept], weights[kept], state[kept]
            out.update({f"t{t}.local": rows.numpy(), f"t{t}.weights": weights.numpy(),
                        f"t{t}.state": state.numpy()})
            if t in self.maps:
                out.update(self._map_part(t, rows.numpy()))
            self.rows += len(rows)
        self.copy_s = time.perf_counter() - begin
        return out

    def _map_part(self, t: int, slots: np.ndarray) -> dict[str, np.ndarray]:
        """A dynamic table's ids and scores of the saved ``slots``, as they were at the copy's
        beginning, and the table's clock then."""
        entries, clock = self.maps[t]
        at = np.searchsorted(entries["slots"], slots)
        out = {f"t{t}.ids": entries["ids"][at], f"t{t}.counts": entries["counts"][at],
               f"t{t}.last": entries["last"][at], f"t{t}.clock": np.array(clock, np.int64)}
        if self.partial:  # tombstones: rows removed since the previous checkpoint
            out[f"t{t}.gone"] = self.removed[t]
        return out
