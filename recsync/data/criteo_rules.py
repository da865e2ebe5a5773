"""The Criteo line format: field layout, the rules a line must follow, the per-line reference
parser that defines them (:func:`parse_line`), and category hashing (:func:`hash_category`).

Input layout: 40 fields per line, ``label, I1..I13, C1..C26``, tab-separated (raw Kaggle /
Terabyte) or comma-separated (DeepCTR's CSV, whose header is :data:`CSV_HEADER`).

Field rules (nothing is silently coerced; a field breaking a rule makes its line a *bad line*):

* label: ``0`` or ``1``; the CSV layout also accepts ``0.0`` and ``1.0``.
* I1..I13: an integer, optionally signed ``-``, optionally written with a zero fraction
  (``260.0``, ``-1.0``, ``7.000``), or empty (missing). Stored as float32 ``log(1 + max(x, 0))``;
  missing and negative values give 0. Integers of any length are valid: the value only feeds
  log1p, which is computed in float64 (from the leading digits plus the digit count beyond 300
  digits, so even a 400-digit value gives a finite, correct log, about 921). ``2.5``, ``1e5``,
  ``+3``, ``5.`` or any other character are bad.
* C1..C26: exactly 8 hex digits (either case), or empty (missing). The value is read as an
  unsigned 32-bit integer v and hashed into its table: ``id = 1 + h(v) % (rows - 1)``, where h is
  the splitmix64 output function (see :func:`hash_category`). Missing is id 0, reserved in every
  table, so every table needs ``rows >= 2``.
* A line must have exactly 40 fields. ``\\r\\n`` line endings are accepted (the ``\\r`` is
  stripped). A last line without a trailing newline is parsed like any other line. An empty line
  is a bad line (wrong field count), except when it is the very last line of a file (a single
  trailing blank line, i.e. the file ends in ``\\n\\n``), which is skipped silently and not counted.
"""

from __future__ import annotations

import math
import re

import numpy as np

from recsync.data.format import MAX_INT32_ROWS as MAX_TABLE_ROWS
from recsync.data.format import NUM_DENSE, NUM_TABLES
from recsync.hashing import splitmix64

NUM_FIELDS = 1 + NUM_DENSE + NUM_TABLES  # 40
DENSE_NAMES = [f"I{i + 1}" for i in range(NUM_DENSE)]
TABLE_NAMES = [f"C{i + 1}" for i in range(NUM_TABLES)]
CSV_HEADER = ",".join(["label", *DENSE_NAMES, *TABLE_NAMES]).encode()


class CriteoFormatError(ValueError):
    """The input is not valid Criteo data (a missing or empty file, a bad line in strict mode)."""


# ---------------------------------------------------------------------------------------------
# Hashing

def check_rows(rows: int, name: str = "table") -> int:
    """``rows`` as an int if it is a valid table size (2 to MAX_TABLE_ROWS), else ValueError."""
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)):
        raise ValueError(f"{name}: rows must be an integer, got {rows!r}")
    if not 2 <= rows <= MAX_TABLE_ROWS:
        raise ValueError(f"{name}: rows must be in [2, {MAX_TABLE_ROWS}] (id 0 is reserved for "
                         f"missing values), got {rows}")
    return int(rows)


def hash_category(values: np.ndarray, rows: int) -> np.ndarray:
    """Hash 32-bit categorical values into ids in ``[1, rows)`` (int64, same shape).

    ``id = 1 + h(v) % (rows - 1)`` with ``h(v)`` the splitmix64 output for state v::

        z = v + 0x9E3779B97F4A7C15            (mod 2**64)
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        h = z ^ (z >> 31)

    Id 0 is reserved for a missing value and never produced here.
    """
    rows = check_rows(rows)
    v = np.asarray(values)
    if v.dtype.kind not in "ui":
        raise ValueError(f"values must be integers, got dtype {v.dtype}")
    if v.size and v.dtype.kind == "i" and (v.min() < 0 or v.max() > 0xFFFFFFFF):
        raise ValueError("values must be in [0, 2**32)")
    if v.size and v.dtype.kind == "u" and v.max() > 0xFFFFFFFF:
        raise ValueError("values must be in [0, 2**32)")
    z = splitmix64(v.astype(np.uint64))
    return (z % np.uint64(rows - 1)).astype(np.int64) + 1


# ---------------------------------------------------------------------------------------------
# Reference (per-line) parser: defines the rules; used for rare fields and bad-line reasons.

_DENSE_RE = re.compile(rb"(-?)([0-9]+)(?:\.0+)?")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_LOG10 = math.log(10.0)


def dense_log1p(field: bytes) -> float | None:
    """log(1 + max(x, 0)) of one dense field (0.0 if empty), or None if it is not an integer."""
    if not field:
        return 0.0
    m = _DENSE_RE.fullmatch(field)
    if m is None:
        return None
    digits = m.group(2).lstrip(b"0")
    if m.group(1) or not digits:  # negative (or -0): max(x, 0) = 0
        return 0.0
    if len(digits) <= 300:  # exact in float64 range
        return float(np.log1p(np.float64(int(digits))))
    # beyond float64: log(x) from the leading 30 digits (log1p(x) == log(x) at this size)
    return math.log(int(digits[:30])) + (len(digits) - 30) * _LOG10


def show_bytes(b: bytes, limit: int = 40) -> str:
    s = b.decode("utf-8", errors="backslashreplace")
    return repr(s if len(s) <= limit else s[:limit] + "...")


class _Bad(Exception):
    pass


def parse_line(line: bytes, csv: bool = False) -> tuple[int, list[float], list[int | None]]:
    """Parse one line (without its ``\\n``) the slow, obvious way.

    Returns ``(label, dense log1p values, categorical values or None if missing)``; raises
    :class:`CriteoFormatError` with the reason if the line is bad. The vectorized converter gives
    the same results; this is the rule book it is tested against.
    """
    try:
        return _parse_line(line, csv)
    except _Bad as e:
        raise CriteoFormatError(str(e)) from None


def _parse_line(line: bytes, csv: bool):
    if line.endswith(b"\r"):
        line = line[:-1]
    if not line:
        raise _Bad(f"expected {NUM_FIELDS} fields, got an empty line")
    fields = line.split(b"," if csv else b"\t")
    if len(fields) != NUM_FIELDS:
        raise _Bad(f"expected {NUM_FIELDS} fields, got {len(fields)}")
    lab = fields[0]
    if lab in (b"0", b"1") or (csv and lab in (b"0.0", b"1.0")):
        label = int(lab[:1])
    else:
        raise _Bad(f"bad label {show_bytes(lab)} (expected 0 or 1{', 0.0 or 1.0' if csv else ''})")
    dense = []
    for name, f in zip(DENSE_NAMES, fields[1:1 + NUM_DENSE]):
        v = dense_log1p(f)
        if v is None:
            raise _Bad(f"non-integer dense value in {name}: {show_bytes(f)}")
        dense.append(v)
    cats: list[int | None] = []
    for name, f in zip(TABLE_NAMES, fields[1 + NUM_DENSE:]):
        if not f:
            cats.append(None)
        elif len(f) != 8:
            raise _Bad(f"categorical value in {name} has {len(f)} characters, expected 8 hex "
                       f"digits or empty: {show_bytes(f)}")
        elif not _HEX.issuperset(f):
            raise _Bad(f"non-hex categorical value in {name}: {show_bytes(f)}")
        else:
            cats.append(int(f, 16))
    return label, dense, cats
