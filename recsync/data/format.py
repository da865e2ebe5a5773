"""On-disk layout of a converted CTR data set: the contract between writers and the reader.

A data set is a directory::

    DIR/meta.json                          written last: a directory without it is incomplete
    DIR/train/part-00000.dense.npy         float32 [n, dense features], already transformed
    DIR/train/part-00000.sparse.npy        int32 or int64 [n, single-hot features]: one id each
    DIR/train/part-00000.label.npy         float32 [n], 0 or 1
    DIR/train/part-00000.weight.npy        float32 [n], only if the data set has weights
    DIR/train/part-00000.multi0.values.npy int64 [nnz]: multi-hot feature 0's ids, row after row
    DIR/train/part-00000.multi0.offsets.npy int64 [n + 1]: row i's ids are values[o[i]:o[i+1]]
    DIR/eval/...                           the same for the held-out split

meta.json (format version 2) lists the dense columns, the sparse features (each reads the ids of
one table; several may share a table; a multi-hot one has a pooling), the tables (rows, the
schema's dim if it gave one, ``"kind": "dynamic"`` for a table whose ids are full 64-bit
hashes; without it a table is fixed, ids in [0, rows)), the id dtype, and per split its parts.
Id 0 is "missing". Version 1 (13 dense, 26 single-hot features C1..C26, one table each, int32
ids) is read as the version 2 layout it is.

Parts are plain ``.npy`` files: self-describing, memory-mappable, and loaded with
``allow_pickle=False`` so opening a data set never runs code from it. Single-hot ids are stored as
int32 when every table fits (half the disk and page cache; a dynamic table never does); the
reader widens them to int64.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recsync.data.meta_checks import MAX_TABLE_ROWS, check_meta  # noqa: F401 (re-exported)
from recsync.data.meta_checks import DataFormatError, one_line  # noqa: F401 (re-exported)

FORMAT_NAME = "recsync-ctr"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
NUM_DENSE = 13   # the Criteo layout (criteo conversion, synthetic data, version 1)
NUM_TABLES = 26
SPLITS = ("train", "eval")
MAX_INT32_ROWS = 2**31 - 1  # tables up to this size store their ids as int32
POOLINGS = ("sum", "mean")


@dataclass(frozen=True)
class Feature:
    """A sparse feature: ids into ``table``; ``pooling`` None for one id per row, else the
    feature is multi-hot (up to ``max_len`` ids per row, pooled by "sum" or "mean")."""

    name: str
    table: str
    pooling: str | None = None
    max_len: int = 0

    @property
    def multi_hot(self) -> bool:
        return self.pooling is not None


@dataclass(frozen=True)
class Table:
    """A table's id space. Fixed: ids in [0, rows). Dynamic (meta.json ``"kind": "dynamic"``;
    absent: fixed): ids are any int64, the values' full 64-bit hashes, and ``rows`` is the size
    the table is sized for, not a bound on them."""

    name: str
    rows: int
    dim: int | None = None
    dynamic: bool = False


@dataclass(frozen=True)
class Layout:
    """What a data set's parts hold: dense columns, sparse features, tables, weights."""

    dense: tuple[str, ...]
    features: tuple[Feature, ...]
    tables: tuple[Table, ...]
    weight: bool = False

    @property
    def single(self) -> list[Feature]:
        return [f for f in self.features if not f.multi_hot]

    @property
    def multi(self) -> list[Feature]:
        return [f for f in self.features if f.multi_hot]

    @property
    def id_dtype(self) -> np.dtype:
        fits = all(t.rows <= MAX_INT32_ROWS and not t.dynamic for t in self.tables)
        return np.dtype(np.int32 if fits else np.int64)

    def table_rows(self, name: str) -> int:
        return self.table(name).rows

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)

    @classmethod
    def from_meta(cls, meta: dict) -> "Layout":
        return cls(dense=tuple(meta["dense"]),
                   features=tuple(Feature(f["name"], f["table"], f.get("pooling"),
                                          f.get("max_len", 0)) for f in meta["features"]),
                   tables=tuple(Table(t["name"], t["rows"], t.get("dim"),
                                      t.get("kind") == "dynamic") for t in meta["tables"]),
                   weight=bool(meta.get("weight", False)))


def criteo_layout(table_rows: list[int], table_names: list[str] | None = None) -> Layout:
    """The Criteo layout: I1..I13 dense, one single-hot feature per table (C1..C26)."""
    names = table_names or [f"C{i + 1}" for i in range(len(table_rows))]
    return Layout(dense=tuple(f"I{i + 1}" for i in range(NUM_DENSE)),
                  features=tuple(Feature(n, n) for n in names),
                  tables=tuple(Table(n, int(r)) for n, r in zip(names, table_rows)))


@dataclass
class SplitInfo:
    """Row count, label sum and part files of one split."""

    rows: int = 0
    parts: list[dict] = field(default_factory=list)  # {"name": "part-00000", "rows": n}
    label_sum: float = 0.0


def part_paths(split_dir: Path, name: str, layout: Layout | None = None) -> dict[str, Path]:
    """The array files of one part (kind -> path); without ``layout``, the three every part
    has (dense, sparse, label)."""
    kinds = ["dense", "sparse", "label"]
    if layout is not None:
        kinds += ["weight"] * layout.weight
        for j in range(len(layout.multi)):
            kinds += [f"multi{j}.offsets", f"multi{j}.values"]  # offsets size values
    return {kind: split_dir / f"{name}.{kind}.npy" for kind in kinds}


def part_name(index: int) -> str:
    return f"part-{index:05d}"


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
    os.replace(tmp, path)


def write_part(split_dir: Path, name: str, dense: np.ndarray, sparse: np.ndarray,
               label: np.ndarray, *, layout: Layout | None = None,
               weight: np.ndarray | None = None,
               multi: list[tuple[np.ndarray, np.ndarray]] = ()) -> None:
    """Write one part's arrays, each to a temporary name then renamed into place. Without
    ``layout``: the Criteo layout (int32 ids)."""
    id_dtype = layout.id_dtype if layout is not None else np.dtype(np.int32)
    arrays = {"dense": dense.astype(np.float32, copy=False),
              "sparse": sparse.astype(id_dtype, copy=False),
              "label": label.astype(np.float32, copy=False)}
    if layout is not None and layout.weight:
        arrays["weight"] = np.asarray(weight, np.float32)
    for j, (values, offsets) in enumerate(multi):
        arrays[f"multi{j}.values"] = values.astype(np.int64, copy=False)
        arrays[f"multi{j}.offsets"] = offsets.astype(np.int64, copy=False)
    for kind, path in part_paths(Path(split_dir), name, layout).items():
        _save(path, arrays[kind])


class SplitWriter:
    """Appends rows to one split, cutting a new part every ``part_rows`` rows.

    Rows are buffered in memory up to one part and each part is written to a temporary name
    and renamed, so a crash leaves no half-written part under a final name. Not thread-safe.
    """

    def __init__(self, root: Path, split: str, num_tables: int = NUM_TABLES,
                 num_dense: int = NUM_DENSE, part_rows: int = 1_000_000, *,
                 layout: Layout | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.dir = Path(root) / split
        self.dir.mkdir(parents=True, exist_ok=True)
        self.layout = layout
        if layout is not None:
            num_tables, num_dense = len(layout.single), len(layout.dense)
        self.num_tables, self.num_dense, self.part_rows = num_tables, num_dense, part_rows
        self.num_multi = len(layout.multi) if layout is not None else 0
        self.info = SplitInfo()
        self._buf: list[tuple] = []
        self._buffered = 0

    def write(self, dense: np.ndarray, sparse: np.ndarray, label: np.ndarray,
              weight: np.ndarray | None = None,
              multi: list[tuple[np.ndarray, np.ndarray]] = ()) -> None:
        """Append rows: dense float32 [n, dense], sparse int [n, single-hot features], label
        [n], weight [n] (if the layout has weights), per multi-hot feature (values, offsets
        [n + 1])."""
        n = len(label)
        if dense.shape != (n, self.num_dense) or sparse.shape != (n, self.num_tables):
            raise ValueError(f"bad shapes: dense {dense.shape}, sparse {sparse.shape}, "
                             f"label ({n},)")
        if len(multi) != self.num_multi or any(len(o) != n + 1 for _, o in multi):
            raise ValueError(f"multi: expected {self.num_multi} (values, offsets[{n + 1}])")
        has_weight = self.layout is not None and self.layout.weight
        if has_weight != (weight is not None):
            raise ValueError("weight: give one per row exactly when the layout has weights")
        start = 0
        while start < n:
            take = min(n - start, self.part_rows - self._buffered)
            sel = slice(start, start + take)
            rows = [(v[o[start]:o[start + take]], o[start:start + take + 1] - o[start])
                    for v, o in multi]
            self._buf.append((dense[sel], sparse[sel], label[sel],
                              None if weight is None else weight[sel], rows))
            self._buffered += take
            start += take
            if self._buffered == self.part_rows:
                self._flush()

    def close(self) -> SplitInfo:
        """Write the last partial part and return the split's info."""
        if self._buffered:
            self._flush()
        return self.info

    def _flush(self) -> None:
        name = part_name(len(self.info.parts))
        dense, sparse, label = (np.concatenate([b[i] for b in self._buf]) for i in range(3))
        weight = (np.concatenate([b[3] for b in self._buf]) if self._buf[0][3] is not None
                  else None)
        multi = [concat_ragged([b[4][j] for b in self._buf]) for j in range(self.num_multi)]
        write_part(self.dir, name, dense, sparse, label, layout=self.layout, weight=weight,
                   multi=multi)
        self.info.parts.append({"name": name, "rows": self._buffered})
        self.info.rows += self._buffered
        self.info.label_sum += float(label.sum(dtype=np.float64))
        self._buf, self._buffered = [], 0


def concat_ragged(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Join (values, offsets) pieces, each with offsets starting at 0, into one."""
    values = np.concatenate([v for v, _ in pieces]) if pieces else np.empty(0, np.int64)
    ends = np.cumsum([o[-1] for _, o in pieces])
    shifts = np.concatenate([[0], ends[:-1]]) if pieces else []
    offsets = np.concatenate([[0]] + [o[1:] + s for (_, o), s in zip(pieces, shifts)])
    return values, offsets.astype(np.int64)


def write_meta(root: Path, *, splits: dict[str, SplitInfo], source: dict,
               table_rows: list[int] | None = None, layout: Layout | None = None,
               synthetic: dict | None = None, table_names: list[str] | None = None,
               preprocessing: dict | None = None) -> dict:
    """Write ``meta.json`` (atomically, last) and return it. Give ``layout``, or
    ``table_rows`` (and ``table_names``) for the Criteo layout."""
    if layout is None:
        layout = criteo_layout(table_rows, table_names)
    for t in layout.tables:
        if not 1 <= t.rows <= MAX_TABLE_ROWS:
            raise ValueError(f"table {t.name}: rows must be in [1, {MAX_TABLE_ROWS}], got "
                             f"{t.rows}")
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "num_dense": len(layout.dense),
        "dense": list(layout.dense),
        "features": [{"name": f.name, "table": f.table,
                      **({"pooling": f.pooling, "max_len": f.max_len} if f.multi_hot else {})}
                     for f in layout.features],
        "tables": [{"name": t.name, "rows": int(t.rows), **({"dim": t.dim} if t.dim else {}),
                    **({"kind": "dynamic"} if t.dynamic else {})} for t in layout.tables],
        "id_dtype": layout.id_dtype.name,
        "weight": layout.weight,
        "splits": {k: {"rows": v.rows, "parts": v.parts, "label_sum": v.label_sum}
                   for k, v in splits.items()},
        "source": source,
        "synthetic": synthetic,
        "preprocessing": preprocessing,
    }
    tmp = Path(root) / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, Path(root) / "meta.json")
    return meta


def read_meta(root: Path) -> dict:
    """Load and check ``meta.json`` (a version 1 one is returned in the version 2 layout);
    raise DataFormatError naming the problem."""
    path = Path(root) / "meta.json"
    if not Path(root).is_dir():
        raise DataFormatError(f"{root}: no such data directory (make one with `recsync data "
                              f"convert`, `recsync data synth` or `recsync data criteo`)")
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
    if meta.get("version") not in READ_VERSIONS:
        raise DataFormatError(f"{path}: format version {meta.get('version')!r:.40} is not "
                              f"supported (this recsync reads versions "
                              f"{', '.join(map(str, READ_VERSIONS))}); convert the source data "
                              f"again with this recsync (`recsync data convert`)")
    if meta["version"] == 1:
        meta = _as_version_2(meta, path)
    check_meta(meta, path, SPLITS, POOLINGS)
    return meta


def _as_version_2(meta: dict, path: Path) -> dict:
    """A version 1 meta.json in the version 2 layout: I1..I13, C1..C26 single-hot."""
    if meta.get("num_dense") != NUM_DENSE:
        raise DataFormatError(f"{path}: num_dense is {meta.get('num_dense')!r:.40}; format "
                              f"version 1 has {NUM_DENSE} dense features")
    tables = meta.get("tables")
    if not isinstance(tables, list) or len(tables) != NUM_TABLES:
        got = f"{len(tables)} entries" if isinstance(tables, list) else f"{tables!r:.80}"
        raise DataFormatError(f"{path}: tables must list {NUM_TABLES} tables in format "
                              f"version 1, got {got}")
    names = [t.get("name") if isinstance(t, dict) else None for t in tables]
    return {**meta, "dense": [f"I{i + 1}" for i in range(NUM_DENSE)],
            "features": [{"name": n, "table": n} for n in names], "id_dtype": "int32",
            "weight": False}
