"""On-disk layout of a converted CTR data set: the contract between writers and the reader.

A data set is a directory::

    DIR/meta.json                     written last: a directory without it is incomplete
    DIR/train/part-00000.dense.npy    float32 [n, num_dense], already log(1 + max(x, 0))
    DIR/train/part-00000.sparse.npy   int32   [n, num_tables], ids in [0, table rows)
    DIR/train/part-00000.label.npy    float32 [n], 0 or 1
    DIR/eval/...                      the same for the held-out split

Parts are plain ``.npy`` files: self-describing, memory-mappable, and loaded with
``allow_pickle=False`` so opening a data set never runs code from it. Ids are stored as int32 to
halve the disk and page-cache footprint; the reader widens them to int64 (the wire dtype).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT_NAME = "recsync-ctr"
FORMAT_VERSION = 1
NUM_DENSE = 13
NUM_TABLES = 26
SPLITS = ("train", "eval")
MAX_TABLE_ROWS = 2**31 - 1  # ids are stored as int32
PART_NAME = re.compile(r"part-[0-9]{5,}")  # what part_name() makes; nothing else is opened
DTYPES = {"dense": np.dtype(np.float32), "sparse": np.dtype(np.int32),
          "label": np.dtype(np.float32)}


class DataFormatError(ValueError):
    """A data set directory is missing, incomplete, not of this format, or inconsistent with its
    meta.json. The message is one line naming the file (and the key or row): it is what a user
    sees, also when a worker process raises it."""


def one_line(e: BaseException | str) -> str:
    """A message on one line (library errors may span several), for one-line user errors."""
    return " ".join(str(e).split())


@dataclass
class SplitInfo:
    """Row count and part files of one split."""

    rows: int = 0
    parts: list[dict] = field(default_factory=list)  # {"name": "part-00000", "rows": n}


def part_paths(split_dir: Path, name: str) -> dict[str, Path]:
    """The three array files of one part."""
    return {kind: split_dir / f"{name}.{kind}.npy" for kind in ("dense", "sparse", "label")}


def part_name(index: int) -> str:
    return f"part-{index:05d}"


def write_part(split_dir: Path, name: str, dense: np.ndarray, sparse: np.ndarray,
               label: np.ndarray) -> None:
    """Write one part's three arrays, each to a temporary name then renamed into place."""
    arrays = {"dense": dense.astype(np.float32, copy=False),
              "sparse": sparse.astype(np.int32, copy=False),
              "label": label.astype(np.float32, copy=False)}
    for kind, path in part_paths(Path(split_dir), name).items():
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(arrays[kind]), allow_pickle=False)
        os.replace(tmp, path)


class SplitWriter:
    """Appends rows to one split, cutting a new part every ``part_rows`` rows.

    Rows are buffered in memory up to one part (``part_rows`` x ~160 bytes) and each part is
    written to a temporary name and renamed, so a crash leaves no half-written part under a
    final name. Not thread-safe.
    """

    def __init__(self, root: Path, split: str, num_tables: int = NUM_TABLES,
                 num_dense: int = NUM_DENSE, part_rows: int = 1_000_000):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.dir = Path(root) / split
        self.dir.mkdir(parents=True, exist_ok=True)
        self.num_tables, self.num_dense, self.part_rows = num_tables, num_dense, part_rows
        self.info = SplitInfo()
        self._buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._buffered = 0

    def write(self, dense: np.ndarray, sparse: np.ndarray, label: np.ndarray) -> None:
        """Append rows: dense float32 [n, num_dense], sparse int [n, num_tables], label [n]."""
        n = len(label)
        if dense.shape != (n, self.num_dense) or sparse.shape != (n, self.num_tables):
            raise ValueError(f"bad shapes: dense {dense.shape}, sparse {sparse.shape}, "
                             f"label ({n},)")
        while n:
            take = min(n, self.part_rows - self._buffered)
            self._buf.append((dense[:take], sparse[:take], label[:take]))
            self._buffered += take
            dense, sparse, label, n = dense[take:], sparse[take:], label[take:], n - take
            if self._buffered == self.part_rows:
                self._flush()

    def close(self) -> SplitInfo:
        """Write the last partial part and return the split's info."""
        if self._buffered:
            self._flush()
        return self.info

    def _flush(self) -> None:
        name = part_name(len(self.info.parts))
        write_part(self.dir, name, *(np.concatenate([b[i] for b in self._buf]) for i in range(3)))
        self.info.parts.append({"name": name, "rows": self._buffered})
        self.info.rows += self._buffered
        self._buf, self._buffered = [], 0


def write_meta(root: Path, *, table_rows: list[int], splits: dict[str, SplitInfo],
               source: dict, synthetic: dict | None = None,
               table_names: list[str] | None = None) -> dict:
    """Write ``meta.json`` (atomically, last) and return it."""
    names = table_names or [f"C{i + 1}" for i in range(len(table_rows))]
    for name, rows in zip(names, table_rows):
        if not 1 <= rows <= MAX_TABLE_ROWS:
            raise ValueError(f"table {name}: rows must be in [1, {MAX_TABLE_ROWS}], got {rows}")
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "num_dense": NUM_DENSE,
        "tables": [{"name": n, "rows": int(r)} for n, r in zip(names, table_rows)],
        "splits": {k: {"rows": v.rows, "parts": v.parts} for k, v in splits.items()},
        "source": source,
        "synthetic": synthetic,
    }
    tmp = Path(root) / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, Path(root) / "meta.json")
    return meta


def read_meta(root: Path) -> dict:
    """Load and check ``meta.json``; raise DataFormatError naming the problem."""
    path = Path(root) / "meta.json"
    if not Path(root).is_dir():
        raise DataFormatError(f"{root}: no such data directory (make one with `recsync data synth` "
                              f"or `recsync data criteo`)")
    if not path.is_file():
        raise DataFormatError(f"{path}: missing; the data set at {root} is incomplete or was "
                              f"never converted")
    try:
        meta = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:  # JSON or UTF-8 errors; absurd nesting
        raise DataFormatError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise DataFormatError(f"{path}: must hold a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT_NAME:
        raise DataFormatError(f"{path}: format is {meta.get('format')!r:.80}, expected "
                              f"{FORMAT_NAME!r}")
    if meta.get("version") != FORMAT_VERSION:
        raise DataFormatError(f"{path}: format version {meta.get('version')!r:.40} is not "
                              f"supported (this recsync reads version {FORMAT_VERSION})")
    check_meta(meta, path)
    return meta


def _is_int(v, lo: int, hi: int | None = None) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and v >= lo
            and (hi is None or v <= hi))


def check_meta(meta: dict, path: Path) -> None:
    """Check what meta.json says before anything is opened or sized from it: the counts of
    features, each table's rows (the tables are allocated from them), and the splits' part names
    (they become file names, so only ``part-NNNNN`` is accepted: never a path). Raises
    DataFormatError naming ``path`` and the key."""
    def bad(key: str, why: str):
        raise DataFormatError(f"{path}: {key} {why}")

    if meta.get("num_dense") != NUM_DENSE:
        bad("num_dense", f"is {meta.get('num_dense')!r}; format version {FORMAT_VERSION} has "
                         f"{NUM_DENSE} dense features")
    tables = meta.get("tables")
    if not isinstance(tables, list) or len(tables) != NUM_TABLES:
        got = f"{len(tables)} entries" if isinstance(tables, list) else repr(tables)
        bad("tables", f"must list {NUM_TABLES} tables, got {got}")
    for i, t in enumerate(tables):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            bad(f"tables[{i}]", f"must be {{\"name\": ..., \"rows\": ...}}, got {t!r:.80}")
        if not _is_int(t.get("rows"), 1, MAX_TABLE_ROWS):
            bad(f"tables[{i}].rows", f"(table {t['name']!r}) must be an integer in "
                                     f"[1, {MAX_TABLE_ROWS}], got {t.get('rows')!r:.40}")
    splits = meta.get("splits")
    if not isinstance(splits, dict):
        bad("splits", f"must be an object, got {splits!r:.80}")
    for split, info in splits.items():
        key = f"splits.{split}"
        if split not in SPLITS:
            bad("splits", f"has an unknown split {split!r:.40} (splits are {', '.join(SPLITS)})")
        if (not isinstance(info, dict) or not _is_int(info.get("rows"), 0)
                or not isinstance(info.get("parts"), list)):
            bad(key, f"must be {{\"rows\": n, \"parts\": [...]}}, got {info!r:.80}")
        names = set()
        for j, part in enumerate(info["parts"]):
            name = part.get("name") if isinstance(part, dict) else None
            if not isinstance(name, str) or not PART_NAME.fullmatch(name):
                bad(f"{key}.parts[{j}].name", f"must be part-NNNNN (a file name in {split}/, "
                                              f"never a path), got {name!r:.80}")
            if name in names:
                bad(f"{key}.parts[{j}].name", f"repeats {name!r}")
            names.add(name)
            if not _is_int(part.get("rows"), 0):
                bad(f"{key}.parts[{j}].rows", f"must be an integer >= 0, got "
                                              f"{part.get('rows')!r:.40}")
        total = sum(p["rows"] for p in info["parts"])
        if total != info["rows"]:
            bad(f"{key}.rows", f"is {info['rows']} but its parts hold {total} rows")
