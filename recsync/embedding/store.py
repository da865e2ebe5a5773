"""EmbeddingStore: the rows of some tables, their optimizer state, pull and push.

The local trainer uses one store holding every row; a parameter-server shard holds one store
with the rows it owns (``shard``/``num_shards``, see sharding.py). Callers always speak global
ids.

Rows are initialised lazily, the first time they are pulled or pushed, from a counter-based hash
of (seed, table, id, column). So a row's initial value does not depend on how tables are sharded
or in which order rows are touched, start-up costs nothing, and resident memory grows only with
the rows actually used (the table tensors are allocated with ``torch.empty``, whose untouched
pages the OS never materialises).

A dynamic table (``TableSpec.dynamic``) takes any int64 id instead: its rows live in slots of a
map per store (embedding/dynamic_table.py), with admission and eviction; ``weights``, ``state``
and ``initialized`` then index slots, and snapshots add each saved slot's id (``t{t}.ids``).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import torch

from recsync.data.hashing import splitmix64
from recsync.embedding.dynamic_chain import resolve_dynamic
from recsync.embedding.dynamic_table import DynamicTable, keys_of, metadata_bytes
from recsync.embedding.memory import check_table_memory
from recsync.embedding.rows_copy import RowsCopy
from recsync.embedding.sharding import local_index
from recsync.embedding.spec import TableSpec


def initial_rows(seed: int, table: int, ids: torch.Tensor, dim: int, scale: float) -> torch.Tensor:
    """Initial values of rows ``ids`` of table number ``table``: uniform in [-scale, scale).

    Deterministic in (seed, table, id, column) only.
    """
    key = splitmix64(np.array([(seed * 1_000_003 + table) % 2**64], dtype=np.uint64))[0]
    counter = (ids.numpy().astype(np.uint64)[:, None] * np.uint64(dim)
               + np.arange(dim, dtype=np.uint64)[None, :])
    bits = splitmix64(counter + key) >> np.uint64(40)  # top 24 bits: exact in float32
    unit = bits.astype(np.float32) * np.float32(2.0 ** -24)
    return torch.from_numpy(unit * np.float32(2 * scale) - np.float32(scale))


class EmbeddingStore:
    """Rows and row-optimizer state of several tables (or of one shard of them).

    Not thread-safe: one caller at a time (the local trainer's loop, or a PS actor's event
    loop), except for a background copy (``begin_copy``), which pushes respect.
    """

    def __init__(self, tables: list[TableSpec], optimizer, *, seed: int = 0,
                 init_scale: float = 0.05, shard: int = 0, num_shards: int = 1):
        """Raises TableMemoryError, before allocating, if the tables fully touched would not
        fit this machine's memory (embedding/memory.py)."""
        if not 0 <= shard < num_shards:
            raise ValueError(f"shard must be in [0, {num_shards}), got {shard}")
        self.tables, self.optimizer = tables, optimizer
        self.seed, self.init_scale = seed, init_scale
        self.shard, self.num_shards = shard, num_shards
        local_rows = [t.rows_per_shard(shard, num_shards) for t in tables]
        # before any allocation: table sizes come from a data set's meta.json
        check_table_memory(local_rows, max((t.dim for t in tables), default=1),
                           state_dim=optimizer.state_dim, table_names=[t.name for t in tables],
                           extra_bytes=sum(metadata_bytes(t) for t in tables if t.dynamic))
        self.dynamic = {i: DynamicTable(t, i, optimizer, seed=seed, init_scale=init_scale,
                                        initial_rows=initial_rows)
                        for i, t in enumerate(tables) if t.dynamic is not None}
        # a fixed table's weights, state and flags are views of one storage per row width,
        # so that a pull reads every table of one width in one gather (pull_arrays)
        self._widths: dict[int, _Width] = {}
        for t, (n, spec) in enumerate(zip(local_rows, tables)):
            if t not in self.dynamic:
                self._widths.setdefault(spec.dim, _Width(spec.dim)).add(t, n)
        views = {t: v for width in self._widths.values()
                 for t, v in width.allocate(optimizer.state_dim).items()}
        self.weights = [self.dynamic[t].weights if t in self.dynamic else views[t][0]
                        for t in range(len(tables))]
        self.state = [self.dynamic[t].state if t in self.dynamic else views[t][1]
                      for t in range(len(tables))]
        self.initialized = [self.dynamic[t].live if t in self.dynamic else views[t][2]
                            for t in range(len(tables))]
        self.copying: RowsCopy | None = None  # a background copy in progress (begin_copy)

    def pull(self, table: int, ids: torch.Tensor, *, admit: bool = True) -> torch.Tensor:
        """Rows of ``ids`` (int64 [n], global ids owned by this store, duplicates allowed).

        Returns a new float32 tensor [n, dim] (a copy: later pushes do not change it). Blocks.
        A dynamic table's ids without a row read zeros; ``admit`` False (an evaluation's pull)
        changes nothing in it: no admission, eviction or scoring.
        """
        if table in self.dynamic:
            return self.dynamic[table].pull(ids, self.copying, admit)
        local = self._ensure_initialized(table, ids)
        return self.weights[table].index_select(0, local)

    def pull_tables(self, ids: list[torch.Tensor], *, admit: bool = True) -> list[torch.Tensor]:
        """``pull`` of every table t's ``ids[t]`` (empty: none), as ``pull_arrays``."""
        return [torch.from_numpy(r) for r in self.pull_arrays([i.numpy() for i in ids],
                                                                admit=admit)]

    def pull_arrays(self, ids: list[np.ndarray], *, admit: bool = True,
                    out=None) -> list[np.ndarray]:
        """``pull`` of every table t's ``ids[t]`` (int64 arrays, may be read-only; empty:
        none), in and out as arrays. The fixed tables of one row width are read in one gather
        from their one storage: per-table op overhead was most of a small pull's time.
        ``out(shape, dtype)``: where the one gather of every table may go (an array, or None:
        a new one); the direct data path's answer slot (ps/channel_shm.py)."""
        result: list[np.ndarray | None] = [None] * len(ids)
        for t in self.dynamic:  # (a table with no id here: nothing to read, nothing touched)
            result[t] = (self.pull(t, read_only_tensor(ids[t]), admit=admit).numpy()
                         if len(ids[t]) else np.empty((0, self.tables[t].dim), np.float32))
        for width in self._widths.values():
            parts = [ids[t] for t in width.numbers]
            flat, bounds = width.rows_of(parts, self.num_shards)
            if not width.initialized_np.take(flat).all():
                for t, i in zip(width.numbers, parts):  # once per row, off the steady state
                    self._ensure_initialized(t, read_only_tensor(i))
            # numpy's take: a third faster than index_select on rows scattered over GBs
            whole = not self.dynamic and len(width.numbers) == len(ids)  # one gather, in order
            into = out((len(flat), width.dim), np.float32) if whole and out else None
            # (mode "clip": ids are checked above; "raise" would gather into a buffer first)
            rows = width.weights_np.take(flat, axis=0, out=into, mode="clip")
            for t, start, end in zip(width.numbers, bounds, bounds[1:]):
                result[t] = rows[start:end]
            if whole:
                return RowViews(result, rows, bounds)
        return result

    def push(self, table: int, ids: torch.Tensor, grads: torch.Tensor,
             lr_scale: float = 1.0) -> None:
        """Apply the row optimizer to rows ``ids`` with gradients ``grads`` [n, dim].

        ``ids`` must be unique (sum duplicate gradients first); ``lr_scale`` multiplies the
        learning rate of this update (staleness-aware modes use it). Blocks.
        """
        if table in self.dynamic:
            return self.dynamic[table].push(ids, grads, lr_scale, self.copying)
        self.optimizer.apply_to_table(self.weights[table], self.state[table],
                                      self._writable(table, ids), grads, lr_scale)

    def _writable(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """The local rows of ``ids`` in a fixed table, initialised, about to be written (a
        checkpoint copy in progress saves those it still needs first)."""
        local = self._ensure_initialized(table, ids)
        if self.copying is not None:
            self.copying.before_write(table, local)
        return local

    def push_tables(self, ids: list, grads: list, lr_scale: float = 1.0) -> None:
        """``push`` of every table t with ``ids[t]``, ``grads[t]`` (numpy arrays or tensors;
        empty: none). The fixed tables of one row width are updated together in their one
        storage (``apply_to_rows``): per-table op overhead was most of a small push's time,
        and so were conversions between tensors and arrays, which are left out here."""
        for t in self.dynamic:
            if len(ids[t]):
                self.push(t, read_only_tensor(as_array(ids[t])),
                          read_only_tensor(as_array(grads[t])), lr_scale)
        for width in self._widths.values():
            parts = [as_array(ids[t]) for t in width.numbers]
            flat, _ = width.rows_of(parts, self.num_shards)
            if not len(flat):
                continue
            if self.copying is not None or not width.initialized_np.take(flat).all():
                for t, i in zip(width.numbers, parts):  # first touches; a copy's rows saved
                    if len(i):
                        self._writable(t, read_only_tensor(i))
            self.optimizer.apply_to_rows(width.weights, width.state, flat, np.concatenate(
                [as_array(grads[t]) for t in width.numbers]), lr_scale)

    def snapshot(self, rows: list[torch.Tensor] | None = None, *,
                 checkpoint: bool = True) -> dict[str, np.ndarray]:
        """Copies of every touched row, its optimizer state and its local index, per table
        (untouched rows are their deterministic initial values: nothing to save). ``rows``:
        only these local indices per table (those of them that were touched). ``checkpoint``
        False: a reading that changes nothing (RowsCopy: no expiry, no tombstones taken)."""
        return RowsCopy(self, rows, checkpoint=checkpoint).run()

    def begin_copy(self, rows: list[torch.Tensor] | None = None, choose=None) -> RowsCopy:
        """``snapshot`` as of now, taken by ``RowsCopy.run`` on another thread while pushes go
        on (they save a row's old value before changing it). Pulls may go on too; nothing
        else may change the store until the copy has run."""
        if self.copying is not None:
            raise RuntimeError("a copy of this store is already in progress")
        self.copying = RowsCopy(self, rows, choose)
        return self.copying

    def restore_chain(self, chain: list[dict[str, np.ndarray]]) -> None:
        """Hold what a full snapshot and the partial ones after it (oldest first) saved: a
        fixed table's rows each saved overwrite the earlier ones; a dynamic table's are
        resolved by id, tombstones removing ids (embedding/dynamic_chain.py), and then held
        as a full snapshot's (at most its capacity: the best-scored)."""
        first = dict(chain[0])
        if len(chain) > 1:
            for t in self.dynamic:
                first.update(resolve_dynamic(chain, t))
        self.restore(first)
        for arrays in chain[1:]:
            self.restore(arrays, on_top=True, dynamic=False)

    def restore(self, arrays: dict[str, np.ndarray], *, on_top: bool = False,
                dynamic: bool = True) -> None:
        """Make the store hold exactly what ``snapshot`` saved (rows it did not save are
        untouched again, re-initialised on first use); ``on_top``: only overwrite the rows it
        saved (a partial snapshot applied to a full one: fixed tables only, see
        ``restore_chain``); ``dynamic`` False: leave the dynamic tables as they are."""
        if self.copying is not None:
            raise RuntimeError("the store cannot be restored while a copy of it is in progress")
        for t, (w, st, init) in enumerate(zip(self.weights, self.state, self.initialized)):
            if t in self.dynamic and not dynamic:
                continue
            try:
                local = torch.from_numpy(np.array(arrays[f"t{t}.local"], dtype=np.int64))
                rows = torch.from_numpy(np.array(arrays[f"t{t}.weights"], dtype=np.float32))
                state = torch.from_numpy(np.array(arrays[f"t{t}.state"], dtype=np.float32))
            except KeyError as e:
                raise ValueError(f"the snapshot lacks {e.args[0]} (table {t} of "
                                 f"{len(self.weights)})") from None
            if rows.shape != (len(local), w.shape[1]) or state.shape != (len(local),
                                                                         st.shape[1]):
                raise ValueError(f"table {t}: the snapshot's rows {tuple(rows.shape)} / state "
                                 f"{tuple(state.shape)} do not fit this store")
            if t in self.dynamic:
                self._restore_dynamic(t, arrays, rows, state, on_top)
                continue
            if f"t{t}.clock" in arrays:  # its rows are a dynamic table's slots, not ids
                raise ValueError(f"table {self.tables[t].name} is fixed, but the snapshot was "
                                 f"taken of a dynamic table")
            if len(local) and (int(local.max()) >= len(w) or int(local.min()) < 0):
                raise ValueError(f"table {t}: the snapshot has rows outside this store's "
                                 f"{len(w)}")
            if not on_top:
                init.fill_(False)
            w.index_copy_(0, local, rows)
            st.index_copy_(0, local, state)
            init.index_fill_(0, local, True)

    def _restore_dynamic(self, t: int, arrays, rows, state, on_top: bool) -> None:
        name = self.tables[t].name
        if f"t{t}.ids" not in arrays:
            raise ValueError(f"table {name} is dynamic, but the snapshot has no ids for it "
                             f"(t{t}.ids): it was taken of a fixed table")
        if on_top:
            raise ValueError(f"table {name} is dynamic: a partial snapshot is applied with the "
                             f"chain it belongs to (restore_chain), by id")
        extra = {k: np.asarray(arrays[f"t{t}.{k}"], dtype=np.int64) if f"t{t}.{k}" in arrays
                 else None for k in ("counts", "last", "clock")}
        self.dynamic[t].restore(np.asarray(arrays[f"t{t}.ids"], dtype=np.int64), rows, state,
                                extra["counts"], extra["last"],
                                None if extra["clock"] is None else int(extra["clock"]))

    def rows_of(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """The local rows of ``ids`` (global, owned here): a fixed table's local indices, a
        dynamic table's slots (-1 where an id has none)."""
        if table not in self.dynamic:
            return local_index(ids, self.num_shards)
        return torch.from_numpy(self.dynamic[table].map.find(keys_of(ids)))

    def expire_idle(self) -> int:
        """Dynamic tables: remove rows idle for longer than their ``ttl`` (checkpoint rounds
        call this); how many went."""
        return sum(table.expire() for table in self.dynamic.values())

    def dynamic_stats(self) -> dict[str, dict]:
        """Per dynamic table (by name): live rows, capacity, admitted, refused, evicted,
        expired, dropped gradients."""
        return {self.tables[t].name: table.stats() for t, table in self.dynamic.items()}

    def num_initialized(self) -> int:
        """How many rows have been touched (and so hold memory) so far."""
        return int(sum(int(m.sum()) for m in self.initialized))

    def _ensure_initialized(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        local = local_index(ids, self.num_shards)
        known = self.initialized[table].index_select(0, local)
        if not bool(known.all()):  # the steady state of a run skips the rest
            fresh = ~known
            new_ids = torch.unique(ids[fresh])
            new_local = local_index(new_ids, self.num_shards)
            spec = self.tables[table]
            self.weights[table].index_copy_(
                0, new_local, initial_rows(self.seed, table, new_ids, spec.dim, self.init_scale))
            self.state[table].index_fill_(0, new_local, self.optimizer.initial_state)
            self.initialized[table].index_fill_(0, new_local, True)
        return local


def as_array(a) -> np.ndarray:
    """``a`` as a numpy array (a CPU tensor's without a copy)."""
    return a.numpy() if isinstance(a, torch.Tensor) else a


def read_only_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a`` without a copy, also when ``a`` is read-only (Ray hands arguments
    over in read-only shared memory): only for arrays nothing writes to, a call's row ids and
    a push's gradients (the store reads them; a write would fail). Saves a copy of every push's
    gradients (3.4 MB at 2,048 ids per table on 26 tables)."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():  # torch warns that writing to it would be undefined
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


class RowViews(list):
    """A pull's rows per table that are consecutive parts of one array, ``flat`` (one gather),
    ``bounds`` where each begins and ends: the direct data path sends ``flat`` once
    (ps/packing.py). Pickles (and copies) as a plain list; made from parts alone (as code that
    rebuilds a list by its type does), it is one (``flat`` None)."""

    def __init__(self, parts, flat: np.ndarray | None = None, bounds: list[int] | None = None):
        super().__init__(parts)
        self.flat, self.bounds = flat, bounds

    def __reduce__(self):
        return list, (list(self),)


class _Width:
    """The fixed tables of one row width: one storage each for their rows, optimizer state
    and initialised flags; table ``numbers[k]`` holds ``sizes[k]`` rows from ``starts[k]``."""

    def __init__(self, dim: int):
        self.dim = dim
        self.numbers: list[int] = []  # table numbers, in order
        self._rows: list[int] = []  # each one's local rows

    def add(self, table: int, rows: int) -> None:
        self.numbers.append(table)
        self._rows.append(rows)

    def allocate(self, state_dim: int) -> dict[int, tuple[torch.Tensor, ...]]:
        """Allocate the storages (``torch.empty``: untouched pages take no memory); per table,
        its (weights, state, initialized) views."""
        total = sum(self._rows)
        self.weights = torch.empty(total, self.dim)
        self.initialized = torch.zeros(total, dtype=torch.bool)
        self.state = torch.empty(total, state_dim)
        self.weights_np, self.initialized_np = self.weights.numpy(), self.initialized.numpy()
        starts = [0, *itertools.accumulate(self._rows)][:-1]
        self.starts = np.array(starts, dtype=np.int64)
        self.sizes = np.array(self._rows, dtype=np.uint64)
        return {t: tuple(x[start:start + n] for x in (self.weights, self.state, self.initialized))
                for t, start, n in zip(self.numbers, starts, self._rows)}

    def rows_of(self, parts: list[np.ndarray], num_shards: int) -> tuple[np.ndarray, list]:
        """Indices into the storages of the global ids of each of this width's tables
        (``parts``, in table order), and where each table's part begins and ends."""
        lengths = [len(i) for i in parts]
        flat = np.concatenate(parts).astype(np.int64, copy=False)
        if num_shards > 1:
            flat = flat // num_shards
        # (one table's bad id must not read its neighbour's rows: unsigned, negatives fail too)
        if not (flat.view(np.uint64) < np.repeat(self.sizes, lengths)).all():
            bad, n = next((t, n) for t, i, n in zip(self.numbers, parts, self.sizes)
                          if not ((i.astype(np.int64) // num_shards).view(np.uint64) < n).all())
            raise IndexError(f"table {bad}: an id outside the {n} rows this store holds of it")
        return flat + np.repeat(self.starts, lengths), [0, *itertools.accumulate(lengths)]
