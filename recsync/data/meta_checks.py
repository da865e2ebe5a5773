"""Checks of a data set's meta.json before anything is opened or sized from it.

Table sizes become allocations and part names become file names, so meta.json is untrusted
input: every key is checked here, and a failure is one line naming the file and the key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

# The bounds a data set's meta.json must keep, here alone: the schema of `recsync data convert`
# (recsync/data/schema.py) accepts exactly these, so nothing it converts is refused when read.
MAX_TABLE_ROWS = 2**40  # ids are int64; memory is checked where tables are allocated
MAX_DIM = 65_536  # a table's embedding width
MAX_LIST_LEN = 1_000_000  # a multi-hot feature's max_len
MAX_FEATURES = 100_000  # dense columns, sparse features, tables (each)
MAX_MODEL_TABLES = 2 * MAX_FEATURES  # a model's tables: deepfm, wide_deep add one per table
MAX_NAME_CHARS = 200
TABLE_KINDS = ("fixed", "dynamic")  # a table's "kind"; absent: fixed (data sets made before it)
PART_NAME = re.compile(r"part-[0-9]{5,}")  # what part_name() makes; nothing else is opened
NAME = re.compile(r"[^\x00-\x1f]{1,%d}" % MAX_NAME_CHARS)  # printable, bounded


class DataFormatError(ValueError):
    """A data set directory is missing, incomplete, not of this format, or inconsistent with its
    meta.json. The message is one line naming the file (and the key or row): it is what a user
    sees, also when a worker process raises it."""


def one_line(e: BaseException | str) -> str:
    """A message on one line (library errors may span several), for one-line user errors."""
    return " ".join(str(e).split())


def _is_int(v, lo: int, hi: int | None = None) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool) and v >= lo
            and (hi is None or v <= hi))


def _is_name(v) -> bool:
    return isinstance(v, str) and bool(NAME.fullmatch(v))


def check_meta(meta: dict, path: Path, splits: tuple[str, ...], poolings: tuple[str, ...]) -> None:
    """Check the counts of features, each table's rows, the features' tables and poolings, and
    the splits' part names (only ``part-NNNNN``: never a path). Raises DataFormatError naming
    ``path`` and the key."""
    def bad(key: str, why: str):
        raise DataFormatError(f"{path}: {key} {why}")

    dense = meta.get("dense")
    if not isinstance(dense, list) or len(dense) > MAX_FEATURES or not all(map(_is_name, dense)):
        bad("dense", f"must list the dense column names, got {dense!r:.80}")
    if meta.get("num_dense", len(dense)) != len(dense):
        bad("num_dense", f"is {meta.get('num_dense')!r:.40} but dense lists {len(dense)}")
    tables = meta.get("tables")
    if not isinstance(tables, list) or not 1 <= len(tables) <= MAX_FEATURES:
        bad("tables", f"must list the tables, got {tables!r:.80}")
    for i, t in enumerate(tables):
        if not isinstance(t, dict) or not _is_name(t.get("name")):
            bad(f"tables[{i}]", f"must be {{\"name\": ..., \"rows\": ...}}, got {t!r:.80}")
        if not _is_int(t.get("rows"), 1, MAX_TABLE_ROWS):
            bad(f"tables[{i}].rows", f"(table {t['name']!r}) must be an integer in "
                                     f"[1, {MAX_TABLE_ROWS}], got {t.get('rows')!r:.40}")
        if t.get("dim") is not None and not _is_int(t["dim"], 1, MAX_DIM):
            bad(f"tables[{i}].dim", f"must be an integer in [1, {MAX_DIM}], got {t['dim']!r:.40}")
        if t.get("kind", "fixed") not in TABLE_KINDS:
            bad(f"tables[{i}].kind", f"(table {t['name']!r}) must be one of "
                                     f"{', '.join(TABLE_KINDS)}, got {t.get('kind')!r:.40}")
    table_names = [t["name"] for t in tables]
    if len(set(table_names)) != len(table_names):
        bad("tables", "repeat a name")
    features = meta.get("features")
    if not isinstance(features, list) or not 1 <= len(features) <= MAX_FEATURES:
        bad("features", f"must list the sparse features, got {features!r:.80}")
    for i, f in enumerate(features):
        if not isinstance(f, dict) or not _is_name(f.get("name")):
            bad(f"features[{i}]", f"must be {{\"name\": ..., \"table\": ...}}, got {f!r:.80}")
        if f.get("table") not in table_names:
            bad(f"features[{i}].table", f"(feature {f['name']!r}) names no table in tables: "
                                        f"{f.get('table')!r:.80}")
        if f.get("pooling") is not None:
            if f["pooling"] not in poolings:
                bad(f"features[{i}].pooling", f"must be one of {', '.join(poolings)}, got "
                                              f"{f['pooling']!r:.40}")
            if not _is_int(f.get("max_len"), 1, MAX_LIST_LEN):
                bad(f"features[{i}].max_len", f"must be an integer in [1, {MAX_LIST_LEN}], got "
                                              f"{f.get('max_len')!r:.40}")
    if meta.get("id_dtype") not in ("int32", "int64"):
        bad("id_dtype", f"must be \"int32\" or \"int64\", got {meta.get('id_dtype')!r:.40}")
    if meta["id_dtype"] == "int32" and max(t["rows"] for t in tables) > 2**31 - 1:
        bad("id_dtype", "is int32 but a table has more rows than int32 ids reach")
    if meta["id_dtype"] == "int32" and any(t.get("kind") == "dynamic" for t in tables):
        bad("id_dtype", "is int32 but a table is dynamic (its ids are 64-bit hashes)")
    if not isinstance(meta.get("weight", False), bool):
        bad("weight", f"must be true or false, got {meta.get('weight')!r:.40}")
    _check_preprocessing(meta.get("preprocessing"), bad)
    if not isinstance(meta.get("source"), (dict, type(None))):
        bad("source", f"must be null or an object, got {meta.get('source')!r:.80}")
    _check_splits(meta.get("splits"), bad, splits)


def _check_preprocessing(prep, bad) -> None:
    """A conversion's preprocessing (null for synthetic and Criteo data): the types its readers
    use (the schema itself is validated as a Schema where raw rows are read: data/rows.py)."""
    if prep is None:
        return
    if not isinstance(prep, dict):
        bad("preprocessing", f"must be null or an object, got {prep!r:.80}")
    if not isinstance(prep.get("hash"), str) or not isinstance(prep.get("schema"), dict):
        bad("preprocessing", "must hold a hash name and a schema object")
    fitted = prep.get("standardize") or {}
    if not isinstance(fitted, dict):
        bad("preprocessing.standardize", f"must be an object, got {fitted!r:.80}")
    for name, stats in fitted.items():
        if not (isinstance(stats, dict) and _is_finite(stats.get("mean"))
                and _is_finite(stats.get("std")) and stats["std"] > 0):
            bad(f"preprocessing.standardize.{name!r:.40}", f"must be {{\"mean\": m, \"std\": s > "
                                                          f"0}} (finite), got {stats!r:.80}")


def _is_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_splits(info_by_split, bad, splits: tuple[str, ...]) -> None:
    if not isinstance(info_by_split, dict):
        bad("splits", f"must be an object, got {info_by_split!r:.80}")
    for split, info in info_by_split.items():
        key = f"splits.{split}"
        if split not in splits:
            bad("splits", f"has an unknown split {split!r:.40} (splits are {', '.join(splits)})")
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
        label_sum = info.get("label_sum", 0.0)
        if (not isinstance(label_sum, (int, float)) or isinstance(label_sum, bool)
                or not 0 <= label_sum <= info["rows"]):
            bad(f"{key}.label_sum", f"must be a number in [0, rows], got {label_sum!r:.40}")
