"""The reference parser of Criteo text on the one conversion path (presets criteo and criteo_csv,
what `recsync data criteo` runs), written out line by line in plain Python: the rule book the
vectorised converter is held to (tests/unit/test_criteo_fuzz.py, test_criteo.py).

* A line has 40 fields (label, I1..I13, C1..C26), separated by tabs, or by commas after DeepCTR's
  header (whose columns may come in any order). A ``\\r`` before the ``\\n`` is dropped; any other
  ``\\r`` makes the line bad. Blank lines at the end of a file are dropped; elsewhere they are bad.
* A number (label, I1..I13) may have spaces or tabs around it; it must then be a finite decimal
  number (NUMBER). The label must equal 0 or 1. A dense value is stored as float32
  ``log(1 + max(x, 0))``, computed in float64; an empty one is 0.
* A category that is empty is missing (id 0); one of 8 hex digits hashes as its 32-bit value
  (splitmix64), any other as its bytes (FNV-1a 64, then splitmix64); id = 1 + h % (rows - 1).
"""

from __future__ import annotations

import math
import re

import numpy as np

NUMBER = re.compile(rb"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
HEX = frozenset(b"0123456789abcdefABCDEF")
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
COLUMNS = ["label", *DENSE, *CATS]
CSV_HEADER = ",".join(COLUMNS).encode()
M64 = (1 << 64) - 1


class Bad(Exception):
    """The line is bad (skipped and counted)."""


def splitmix64(v: int) -> int:
    z = (v + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def category_id(field: bytes, rows: int) -> int:
    if not field:
        return 0
    if len(field) == 8 and HEX.issuperset(field):
        return 1 + splitmix64(int(field, 16)) % (rows - 1)
    return 1 + splitmix64(fnv1a64(field)) % (rows - 1)


def number(field: bytes) -> float | None:
    """The value of a number field, None if empty; Bad if it is not a finite number."""
    if not field:
        return None
    text = field.strip(b" \t")
    if NUMBER.fullmatch(text) is None or not math.isfinite(v := float(text)):
        raise Bad("not a number")
    return v


def parse_line(line: bytes, columns: list[str], sep: bytes, rows: int):
    """(label, 13 dense float32 values, 26 ids) of one line without its ``\\n``; Bad if bad."""
    if line.endswith(b"\r"):
        line = line[:-1]
    if b"\r" in line:
        raise Bad("a carriage return inside the line")
    fields = line.split(sep)
    if len(fields) != len(columns):
        raise Bad("field count")
    value = dict(zip(columns, fields))
    label = number(value["label"])
    if label not in (0.0, 1.0):
        raise Bad("label")
    dense = [0.0 if (x := number(value[c])) is None else math.log1p(max(x, 0.0)) for c in DENSE]
    return label, np.float32(dense), [category_id(value[c], rows) for c in CATS]


def reference_file(data: bytes, rows: int, eval_fraction: float):
    """What converting ``data`` with `recsync data criteo --table-size rows --eval-fraction f`
    gives: an error (a regex of its message), or (train, eval) as (dense, ids, label) arrays
    and the count of bad lines."""
    if not data.strip(b"\r\n"):  # (files of this size: the reader's first piece)
        return "empty file"
    csv = data.startswith(b"label,")
    columns, sep, body = COLUMNS, b"\t", data
    if csv:
        header, _, body = data.partition(b"\n")
        try:
            columns = header.rstrip(b"\r").decode().split(",")
        except UnicodeDecodeError:
            return "the header is not UTF-8"
        for c in COLUMNS:
            if columns.count(c) != 1:
                return f"column '{c}'"
        sep = b","
    lines = body.split(b"\n")
    while lines and not lines[-1].strip(b"\r"):
        lines.pop()  # blank lines at the end (and the last line's terminator)
    if not lines:
        return "no data rows"
    split_at = len(lines) - int(round(len(lines) * eval_fraction))
    parts, bad = [], 0
    for chunk in (lines[:split_at], lines[split_at:]):
        dense, ids, labels = [], [], []
        for ln in chunk:
            try:
                label, d, c = parse_line(ln, columns, sep, rows)
            except Bad:
                bad += 1
                continue
            labels.append(label)
            dense.append(d)
            ids.append(c)
        parts.append((np.array(dense, np.float32).reshape(-1, 13),
                      np.array(ids, np.int64).reshape(-1, 26), np.array(labels, np.float32)))
    if bad == len(lines):
        return r"all [\d,]+ rows .* are bad"
    if len(parts[0][2]) == 0:
        return "no train rows"
    return parts[0], parts[1], bad


def read_splits(out) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{split: (dense, ids, label)} of a converted Criteo data set, read through its part list."""
    import json
    from pathlib import Path
    out = Path(out)
    meta = json.loads((out / "meta.json").read_text())
    res = {}
    for split, info in meta["splits"].items():
        got = {k: [np.load(out / split / f"{p['name']}.{k}.npy") for p in info["parts"]]
               for k in ("dense", "sparse", "label")}
        empty = {"dense": np.zeros((0, 13), np.float32), "sparse": np.zeros((0, 26), np.int32),
                 "label": np.zeros(0, np.float32)}
        res[split] = tuple(np.concatenate(got[k]) if got[k] else empty[k]
                           for k in ("dense", "sparse", "label"))
        assert len(res[split][0]) == info["rows"]
    return res
