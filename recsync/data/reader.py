"""Memory-mapped batches from a converted data set, and chunks of it to hand out as work.

A chunk is a contiguous row range of one part file, so any process that can open the data set
can read any chunk: that is what lets a work queue give chunks to whichever worker asks first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from recsync.data.chunk import Chunk  # noqa: F401 (re-exported: it lived here)
from recsync.data.format import DataFormatError, Layout, one_line, part_paths, read_meta
from recsync.data.holdout import VALIDATION, cut, held_rows


def take_ragged(values: torch.Tensor, offsets: torch.Tensor,
                idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of a ragged column (row i is values[offsets[i]:offsets[i+1]])."""
    starts = offsets[idx]
    lengths = offsets[idx + 1] - starts
    new = torch.zeros(len(idx) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=new[1:])
    pos = torch.repeat_interleave(starts - new[:-1], lengths) + torch.arange(int(new[-1]))
    return values[pos], new


@dataclass
class Batch:
    """One mini-batch: dense float32 [B, dense], sparse int64 [B, single-hot features], label
    float32 [B], weight float32 [B] or None, and per multi-hot feature (values int64 [nnz],
    offsets int64 [B + 1])."""

    dense: torch.Tensor
    sparse: torch.Tensor
    label: torch.Tensor
    weight: torch.Tensor | None = None
    multi: tuple = ()

    def __len__(self) -> int:
        return len(self.label)

    def take(self, idx: torch.Tensor) -> "Batch":
        """The rows ``idx`` (int64), in that order."""
        return Batch(self.dense[idx], self.sparse[idx], self.label[idx],
                     None if self.weight is None else self.weight[idx],
                     tuple(take_ragged(v, o, idx) for v, o in self.multi))


_ANY_ID = 2**64 - 1  # a dynamic table's last id, seen as unsigned: every int64 is one


def _last_ids(layout: Layout) -> tuple[np.ndarray, list[int]]:
    """Per single-hot feature, and per multi-hot feature, the largest id its table takes (seen
    as unsigned): rows - 1 for a fixed table, any int64 for a dynamic one."""
    def last(f) -> int:
        t = layout.table(f.table)
        return _ANY_ID if t.dynamic else t.rows - 1
    return (np.array([last(f) for f in layout.single], dtype=np.uint64),
            [last(f) for f in layout.multi])


class Dataset:
    """A converted data set opened read-only. Cheap to open; safe to open in many processes.

    Opening checks meta.json (format, feature counts, table sizes, part names: see
    data/meta_checks.py); the first use of a split checks its part files' shapes and dtypes; every
    read checks its ids against the table sizes (a dynamic table's ids are any int64). Each
    failure is a one-line DataFormatError naming the file (table sizes beyond memory are
    refused where tables are allocated).
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.meta = read_meta(self.root)
        self.layout = Layout.from_meta(self.meta)
        self.table_rows = [t.rows for t in self.layout.tables]
        self.table_names = [t.name for t in self.layout.tables]
        self._single_last, self._multi_last = _last_ids(self.layout)
        self._parts: dict[str, list[dict[str, np.ndarray]]] = {}
        self.held = 0  # the training split's last rows held out as "validation" (hold_out)

    def hold_out(self, fraction: float) -> None:
        """Hold out the last ``fraction`` of the training split (in time order) as the
        "validation" split (data/holdout.py; 0: none): from now on "train" means the rows
        before it. Idempotent for the same fraction."""
        self.held = held_rows(self.meta["splits"]["train"]["rows"], fraction)

    @property
    def synthetic(self) -> dict | None:
        """Bayes-optimal eval metrics for synthetic data, else None."""
        return self.meta.get("synthetic")

    def rows(self, split: str) -> int:
        if split == VALIDATION:
            return self.held
        return self._split(split)["rows"] - (self.held if split == "train" else 0)

    def base_rate(self, split: str = "train") -> float | None:
        """The split's label mean, if meta.json records it."""
        info = self._split(split)
        if "label_sum" not in info or not info["rows"]:
            return None
        return info["label_sum"] / info["rows"]

    def _split(self, split: str) -> dict:
        try:
            return self.meta["splits"][split]
        except KeyError:
            raise DataFormatError(f"{self.root}/meta.json: no split {split!r} (has "
                                  f"{sorted(self.meta['splits'])})") from None

    def parts(self, split: str) -> list[dict[str, np.ndarray]]:
        """The memory-mapped arrays of every part of a split, opened once, when the split is
        first used, and checked against meta.json (only the files' headers are read, and the
        offsets of multi-hot features)."""
        if split not in self._parts:
            self._parts[split] = [self._open_part(split, info)
                                  for info in self._split(split)["parts"]]
        return self._parts[split]

    def _expected(self, kind: str, rows: int) -> tuple[tuple, np.dtype]:
        lay = self.layout
        if kind == "dense":
            return (rows, len(lay.dense)), np.dtype(np.float32)
        if kind == "sparse":
            return (rows, len(lay.single)), np.dtype(self.meta["id_dtype"])
        if kind in ("label", "weight"):
            return (rows,), np.dtype(np.float32)
        if kind.endswith(".offsets"):
            return (rows + 1,), np.dtype(np.int64)
        return (-1,), np.dtype(np.int64)  # values: as many as the offsets say

    def _open_part(self, split: str, info: dict) -> dict[str, np.ndarray]:
        rows = info["rows"]
        root = self.root.resolve()
        arrays = {}
        for kind, path in part_paths(self.root / split, info["name"], self.layout).items():
            real = path.resolve()
            if not real.is_relative_to(root):  # a symlink pointing out of the data directory
                raise DataFormatError(f"{path}: resolves to {real}, outside the data directory "
                                      f"{root}")
            try:
                a = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise DataFormatError(f"{path}: cannot be read ({one_line(e)})") from e
            shape, dtype = self._expected(kind, rows)
            if kind.endswith(".values"):
                offsets = arrays[kind.replace(".values", ".offsets")]
                shape = (int(offsets[-1]),)
            elif a.shape[:1] != shape[:1]:
                got = a.shape[0] if a.ndim else 0
                raise DataFormatError(f"{path}: {got} rows, meta.json says {rows} "
                                      f"(splits.{split}.parts of {info['name']})"
                                      + (" plus 1 offset" if kind.endswith("offsets") else ""))
            if a.shape != shape or a.dtype != dtype:
                raise DataFormatError(f"{path}: {a.dtype} {list(a.shape)}, expected {dtype} "
                                      f"{list(shape)} (format version {self.meta['version']}, "
                                      f"{len(self.layout.single)} single-hot features)")
            if kind.endswith(".offsets") and (a[0] != 0 or (np.diff(a) < 0).any()):
                raise DataFormatError(f"{path}: offsets must start at 0 and never decrease")
            arrays[kind] = a
        return arrays

    def chunks(self, split: str, chunk_rows: int) -> list[Chunk]:
        """Cut a split into chunks of at most ``chunk_rows`` rows (never across parts), in
        order. "train" stops before the validation slice; "validation" is that slice."""
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        parts = self._split("train" if split == VALIDATION else split)["parts"]
        ranges = [(p, 0, info["rows"]) for p, info in enumerate(parts)]
        if split in ("train", VALIDATION) and self.held:
            kept, held = cut([info["rows"] for info in parts], self.held)
            ranges = held if split == VALIDATION else kept
        elif split == VALIDATION:
            return []
        name = "train" if split == VALIDATION else split  # where the rows live
        return [Chunk(name, p, s, min(s + chunk_rows, stop)) for p, first, stop in ranges
                for s in range(first, stop, chunk_rows)]

    def read(self, chunk: Chunk, rows: np.ndarray | slice | None = None) -> Batch:
        """Read a chunk, or the given rows of it (indices relative to the chunk start)."""
        arrays = self.parts(chunk.split)[chunk.part]
        if rows is None:
            rows = slice(0, chunk.rows)
        if not isinstance(rows, slice):
            return self.read(chunk).take(torch.as_tensor(rows, dtype=torch.int64))
        sel = slice(chunk.start + rows.start, chunk.start + rows.stop)
        sparse = arrays["sparse"][sel]
        self._check_ids(chunk, "sparse", sparse, sel.start)
        multi = []
        for j in range(len(self._multi_last)):
            offsets = np.array(arrays[f"multi{j}.offsets"][sel.start:sel.stop + 1])
            values = np.array(arrays[f"multi{j}.values"][offsets[0]:offsets[-1]])
            self._check_ids(chunk, f"multi{j}.values", values, int(offsets[0]), multi=j)
            multi.append((torch.from_numpy(values), torch.from_numpy(offsets - offsets[0])))
        weight = arrays.get("weight")
        return Batch(dense=torch.from_numpy(np.array(arrays["dense"][sel], dtype=np.float32)),
                     sparse=torch.from_numpy(sparse.astype(np.int64)),
                     label=torch.from_numpy(np.array(arrays["label"][sel], dtype=np.float32)),
                     weight=None if weight is None else torch.from_numpy(np.array(weight[sel])),
                     multi=tuple(multi))

    def _check_ids(self, chunk: Chunk, kind: str, ids: np.ndarray, first: int,
                   multi: int | None = None) -> None:
        """Every id of a fixed table must be a row of it: an id past the end would index out
        of the embedding table far from here. One vectorised comparison per read (ids seen as
        unsigned, so a negative id is huge and fails the same test; a dynamic table takes every
        int64, and its multi-hot values are not looked at); the search for the first bad one
        runs only when there is one."""
        if multi is not None and self._multi_last[multi] == _ANY_ID:
            return
        unsigned = ids.view(np.uint32 if ids.dtype == np.int32 else np.uint64)
        last = self._single_last if multi is None else np.uint64(self._multi_last[multi])
        inside = unsigned <= last
        if inside.all():
            return
        where = np.argwhere(~inside)[0]
        info = self._split(chunk.split)["parts"][chunk.part]
        path = part_paths(self.root / chunk.split, info["name"], self.layout)[kind]
        if multi is None:
            r, c = int(where[0]), int(where[1])
            feature, place = self.layout.single[c], f"row {first + r}, column {c}"
        else:
            r = int(where[0])
            feature, place = self.layout.multi[multi], f"value {first + r}"
        value = int(ids[tuple(where)])
        rows = self.layout.table_rows(feature.table)
        which = (f"table {feature.table}" if feature.name == feature.table
                 else f"feature {feature.name}, table {feature.table}")
        raise DataFormatError(f"{path}: {place} ({which}): id {value} is outside [0, {rows}), "
                              f"the table's rows in meta.json")

    def batches(self, chunk: Chunk, batch_size: int | Callable[[], int], *,
                shuffle_seed: int | None = None, epoch: int = 0,
                start: int = 0) -> Iterator[Batch]:
        """Batches of one chunk in order, or in a permutation seeded by (shuffle_seed, epoch),
        from its row ``start`` in that order (rows trained before a restore are skipped).

        The last batch of a chunk may be smaller than ``batch_size``. A callable
        ``batch_size`` is asked as each batch is read (an elastic sync run changes a worker's
        share of the global batch between steps).
        """
        size = batch_size if callable(batch_size) else (lambda: batch_size)
        if shuffle_seed is None:
            rows = lambda a, b: self.read(chunk, slice(a, b))  # noqa: E731
        else:
            whole = self.read(chunk)  # one sequential read, then shuffle in memory
            order = torch.from_numpy(np.random.default_rng(
                [shuffle_seed, epoch, chunk.part, chunk.start]).permutation(chunk.rows))
            rows = lambda a, b: whole.take(order[a:b])  # noqa: E731
        while start < chunk.rows:
            stop = min(start + size(), chunk.rows)
            yield rows(start, stop)
            start = stop


def chunk_order(chunks: list[Chunk], *, epoch: int, shuffle_seed: int | None) -> list[Chunk]:
    """The order chunks are visited in an epoch: as stored, or a seeded permutation per epoch."""
    if shuffle_seed is None:
        return list(chunks)
    perm = np.random.default_rng([shuffle_seed, epoch]).permutation(len(chunks))
    return [chunks[i] for i in perm]
