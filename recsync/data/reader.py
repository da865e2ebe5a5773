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

from recsync.data.format import DataFormatError, part_paths, read_meta


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
    """A converted data set opened read-only. Cheap to open; safe to open in many processes."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.meta = read_meta(self.root)
        self.table_rows = [t["rows"] for t in self.meta["tables"]]
        self.table_names = [t["name"] for t in self.meta["tables"]]
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
        """The memory-mapped arrays of every part of a split, opened once and checked."""
        if split not in self._parts:
            opened = []
            for info in self._split(split)["parts"]:
                arrays = {}
                paths = part_paths(self.root / split, info["name"])
                for kind, path in paths.items():
                    try:
                        arrays[kind] = np.load(path, mmap_mode="r", allow_pickle=False)
                    except (OSError, ValueError) as e:
                        raise DataFormatError(f"{path}: cannot be read ({e})") from e
                    if len(arrays[kind]) != info["rows"]:
                        raise DataFormatError(f"{path}: {len(arrays[kind])} rows, meta.json "
                                              f"says {info['rows']}")
                if arrays["sparse"].shape[1:] != (len(self.table_rows),):
                    raise DataFormatError(f"{paths['sparse']}: sparse shape "
                                          f"{arrays['sparse'].shape} does not match "
                                          f"{len(self.table_rows)} tables")
                opened.append(arrays)
            self._parts[split] = opened
        return self._parts[split]

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
        return Batch(dense=torch.from_numpy(np.array(arrays["dense"][sel], dtype=np.float32)),
                     sparse=torch.from_numpy(arrays["sparse"][sel].astype(np.int64)),
                     label=torch.from_numpy(np.array(arrays["label"][sel], dtype=np.float32)))

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
