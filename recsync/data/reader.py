"""Memory-mapped batches from a converted data set, and chunks of it to hand out as work.

A chunk is a contiguous row range of one part file, so any process that can open the data set
can read any chunk: that is what lets a work queue give chunks to whichever worker asks first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from recsync.data.format import DTYPES, DataFormatError, one_line, part_paths, read_meta


@dataclass(frozen=True)
class Chunk:
    """Rows [start, stop) of one part of one split."""

    split: str
    part: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class Batch:
    """One mini-batch: dense float32 [B, 13], sparse int64 [B, 26] ids, label float32 [B]."""

    dense: torch.Tensor
    sparse: torch.Tensor
    label: torch.Tensor

    def __len__(self) -> int:
        return len(self.label)


class Dataset:
    """A converted data set opened read-only. Cheap to open; safe to open in many processes.

    Opening checks meta.json (format, feature counts, table sizes, part names: see
    format.check_meta); the first use of a split checks its part files' shapes and dtypes; every
    read checks its ids against the table sizes. Each failure is a one-line DataFormatError
    naming the file (table sizes beyond memory are refused where tables are allocated).
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.meta = read_meta(self.root)
        self.table_rows = [t["rows"] for t in self.meta["tables"]]
        self.table_names = [t["name"] for t in self.meta["tables"]]
        self._id_end = np.array(self.table_rows, dtype=np.uint32)  # sparse parts are int32
        self._parts: dict[str, list[dict[str, np.ndarray]]] = {}

    @property
    def synthetic(self) -> dict | None:
        """Bayes-optimal eval metrics for synthetic data, else None."""
        return self.meta.get("synthetic")

    def rows(self, split: str) -> int:
        return self._split(split)["rows"]

    def _split(self, split: str) -> dict:
        try:
            return self.meta["splits"][split]
        except KeyError:
            raise DataFormatError(f"{self.root}/meta.json: no split {split!r} (has "
                                  f"{sorted(self.meta['splits'])})") from None

    def parts(self, split: str) -> list[dict[str, np.ndarray]]:
        """The memory-mapped arrays of every part of a split, opened once, when the split is
        first used, and checked against meta.json (only the files' headers are read)."""
        if split not in self._parts:
            self._parts[split] = [self._open_part(split, info)
                                  for info in self._split(split)["parts"]]
        return self._parts[split]

    def _open_part(self, split: str, info: dict) -> dict[str, np.ndarray]:
        rows = info["rows"]
        shapes = {"dense": (rows, self.meta["num_dense"]), "sparse": (rows, len(self.table_rows)),
                  "label": (rows,)}
        root = self.root.resolve()
        arrays = {}
        for kind, path in part_paths(self.root / split, info["name"]).items():
            real = path.resolve()
            if not real.is_relative_to(root):  # a symlink pointing out of the data directory
                raise DataFormatError(f"{path}: resolves to {real}, outside the data directory "
                                      f"{root}")
            try:
                a = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise DataFormatError(f"{path}: cannot be read ({one_line(e)})") from e
            if a.shape[:1] != shapes[kind][:1]:
                raise DataFormatError(f"{path}: {a.shape[0] if a.ndim else 0} rows, meta.json "
                                      f"says {rows} (splits.{split}.parts of {info['name']})")
            if a.shape != shapes[kind] or a.dtype != DTYPES[kind]:
                raise DataFormatError(f"{path}: {a.dtype} {list(a.shape)}, expected "
                                      f"{DTYPES[kind]} {list(shapes[kind])} (format version "
                                      f"{self.meta['version']}, {len(self.table_rows)} tables)")
            arrays[kind] = a
        return arrays

    def chunks(self, split: str, chunk_rows: int) -> list[Chunk]:
        """Cut a split into chunks of at most ``chunk_rows`` rows (never across parts)."""
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        out = []
        for p, info in enumerate(self._split(split)["parts"]):
            for start in range(0, info["rows"], chunk_rows):
                out.append(Chunk(split, p, start, min(start + chunk_rows, info["rows"])))
        return out

    def read(self, chunk: Chunk, rows: np.ndarray | slice | None = None) -> Batch:
        """Read a chunk, or the given rows of it (indices relative to the chunk start)."""
        arrays = self.parts(chunk.split)[chunk.part]
        sel = slice(chunk.start, chunk.stop) if rows is None else (
            slice(chunk.start + rows.start, chunk.start + rows.stop) if isinstance(rows, slice)
            else rows + chunk.start)
        sparse = arrays["sparse"][sel]
        self._check_ids(chunk, sparse, sel)
        return Batch(dense=torch.from_numpy(np.array(arrays["dense"][sel], dtype=np.float32)),
                     sparse=torch.from_numpy(sparse.astype(np.int64)),
                     label=torch.from_numpy(np.array(arrays["label"][sel], dtype=np.float32)))

    def _check_ids(self, chunk: Chunk, sparse: np.ndarray, sel: slice | np.ndarray) -> None:
        """Every id must be a row of its table: an id past the end would index out of the
        embedding table far from here. One vectorised comparison per read (ids seen as uint32,
        so a negative id is huge and fails the same test); the search for the first bad row
        runs only when there is one."""
        inside = sparse.view(np.uint32) < self._id_end
        if inside.all():
            return
        r, c = (int(x) for x in np.argwhere(~inside)[0])
        row = sel.start + r if isinstance(sel, slice) else int(sel[r])
        info = self._split(chunk.split)["parts"][chunk.part]
        path = part_paths(self.root / chunk.split, info["name"])["sparse"]
        raise DataFormatError(f"{path}: row {row}, column {c} (table {self.table_names[c]}): id "
                              f"{int(sparse[r, c])} is outside [0, {self.table_rows[c]}), the "
                              f"table's rows in meta.json")

    def batches(self, chunk: Chunk, batch_size: int, *, shuffle_seed: int | None = None,
                epoch: int = 0) -> Iterator[Batch]:
        """Batches of one chunk in order, or in a permutation seeded by (shuffle_seed, epoch).

        The last batch of a chunk may be smaller than ``batch_size``.
        """
        if shuffle_seed is None:
            for start in range(0, chunk.rows, batch_size):
                yield self.read(chunk, slice(start, min(start + batch_size, chunk.rows)))
            return
        whole = self.read(chunk)  # one sequential read, then shuffle in memory
        order = torch.from_numpy(np.random.default_rng(
            [shuffle_seed, epoch, chunk.part, chunk.start]).permutation(chunk.rows))
        for start in range(0, chunk.rows, batch_size):
            idx = order[start:start + batch_size]
            yield Batch(whole.dense[idx], whole.sparse[idx], whole.label[idx])


def chunk_order(chunks: list[Chunk], *, epoch: int, shuffle_seed: int | None) -> list[Chunk]:
    """The order chunks are visited in an epoch: as stored, or a seeded permutation per epoch."""
    if shuffle_seed is None:
        return list(chunks)
    perm = np.random.default_rng([shuffle_seed, epoch]).permutation(len(chunks))
    return [chunks[i] for i in perm]
