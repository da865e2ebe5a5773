"""Convert Criteo click logs (Kaggle / Terabyte raw TSV, or DeepCTR's CSV) into the binary format.

Input layout: 40 fields per line, ``label, I1..I13, C1..C26``.

* Raw Kaggle / Terabyte: tab-separated, no header.
* DeepCTR sample CSV: comma-separated, first line ``label,I1,...,I13,C1,...,C26``. The layout is
  detected per file from its first line: a line starting with ``label,`` is the CSV header (it
  must then be exactly that header), anything else is the TSV layout. Quoted CSV fields are not
  supported (a quote is just a bad character).

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

Bad lines are skipped and counted; the first 10 are reported as (file, 1-based line number,
reason). With ``strict=True`` the first bad line raises :class:`CriteoFormatError`
``"path:17: expected 40 fields, got 39"``.

Speed: parsing is vectorized in numpy over blocks of the file's bytes (a few MB each, cut at a
newline) and the blocks are parsed on a small thread pool (numpy releases the GIL), so memory stays
bounded and a 2-core machine converts several hundred thousand lines per second. Only rare fields
(dense values longer than 8 characters, or fields the fast path rejects) and the reasons of bad
lines go through the per-field Python reference parser (:func:`parse_line`), which defines the
rules; the vectorized path is checked against it by the tests.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from recsync.data.format import (MAX_TABLE_ROWS, NUM_DENSE, NUM_TABLES, SplitInfo, SplitWriter,
                                 prepare_output_dir, write_meta)
from recsync.hashing import splitmix64

NUM_FIELDS = 1 + NUM_DENSE + NUM_TABLES  # 40
DENSE_NAMES = [f"I{i + 1}" for i in range(NUM_DENSE)]
TABLE_NAMES = [f"C{i + 1}" for i in range(NUM_TABLES)]
CSV_HEADER = ",".join(["label", *DENSE_NAMES, *TABLE_NAMES]).encode()
MAX_EXAMPLES = 10
BLOCK_BYTES = 2 << 20  # bytes per parsed block (fastest on 2 cores); tests shrink it
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_PAD = 16  # zero bytes after every block, so 8-byte windows at any field start stay in bounds


class CriteoFormatError(ValueError):
    """The input is not valid Criteo data (a missing or empty file, a bad line in strict mode)."""


@dataclass
class BadLine:
    path: str
    line: int  # 1-based line number within ``path`` (the CSV header is line 1)
    reason: str


@dataclass
class ConversionReport:
    lines: int  # data lines read (CSV headers and a skipped trailing blank line not counted)
    rows_written: int
    bad_lines: int
    examples: list[BadLine]  # the first MAX_EXAMPLES bad lines, in input order
    train_rows: int
    eval_rows: int
    seconds: float


# ---------------------------------------------------------------------------------------------
# Hashing

def _check_rows(rows: int, name: str = "table") -> int:
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
    rows = _check_rows(rows)
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


def _dense_log1p(field: bytes) -> float | None:
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


def _show(b: bytes, limit: int = 40) -> str:
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
        raise _Bad(f"bad label {_show(lab)} (expected 0 or 1{', 0.0 or 1.0' if csv else ''})")
    dense = []
    for name, f in zip(DENSE_NAMES, fields[1:1 + NUM_DENSE]):
        v = _dense_log1p(f)
        if v is None:
            raise _Bad(f"non-integer dense value in {name}: {_show(f)}")
        dense.append(v)
    cats: list[int | None] = []
    for name, f in zip(TABLE_NAMES, fields[1 + NUM_DENSE:]):
        if not f:
            cats.append(None)
        elif len(f) != 8:
            raise _Bad(f"categorical value in {name} has {len(f)} characters, expected 8 hex "
                       f"digits or empty: {_show(f)}")
        elif not _HEX.issuperset(f):
            raise _Bad(f"non-hex categorical value in {name}: {_show(f)}")
        else:
            cats.append(int(f, 16))
    return label, dense, cats


# ---------------------------------------------------------------------------------------------
# Vectorized block parser

_ONES = 0x0101010101010101
_HIGH = 0x8080808080808080
_ASCII0 = 0x3030303030303030
_NIB = 0x0F0F0F0F0F0F0F0F
_F0 = 0xF0F0F0F0F0F0F0F0
# indexed by the digit count d (1..8) of a dense value held in the low d bytes of a word:
_DMASK = np.array([(1 << (8 * d)) - 1 for d in range(9)], dtype=np.uint64)
_DSHIFT = np.array([8 * (8 - d) if d else 0 for d in range(9)], dtype=np.uint64)
_DFILL = np.array([_ASCII0 & ((1 << (8 * (8 - d))) - 1) for d in range(9)], dtype=np.uint64)
_U = np.uint64


@dataclass
class _Block:
    n_lines: int
    ok_idx: np.ndarray  # local line indices of the rows below, increasing
    label: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    bad_idx: np.ndarray  # local line indices of bad lines
    reasons: list[str]  # reasons of the first MAX_EXAMPLES bad lines


def _decode_dense(w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fast path for dense fields of <= 8 characters.

    ``w``: uint64 little-endian 8-byte windows at the field starts; ``n``: field lengths.
    Returns (ok, log1p value as float32); ok is False for fields the fast path does not handle
    (longer than 8 characters, or anything unusual), which then go to the reference parser.
    """
    neg = (w & _U(0xFF)) == _U(0x2D)
    w1 = w >> (neg.astype(np.uint64) << _U(3))
    n1 = n - neg
    # optional ".0" suffix (other zero fractions take the slow path)
    tail2 = (w1 >> (np.clip(n1 - 2, 0, 6).astype(np.uint64) << _U(3))) & _U(0xFFFF)
    suffix = (n1 >= 3) & (tail2 == _U(0x302E))  # ".0" at n1-2, n1-1 (little-endian pair)
    d = n1 - 2 * suffix
    dc = np.clip(d, 1, 8)
    x = ((w1 & _DMASK[dc]) << _DSHIFT[dc]) | _DFILL[dc]  # digits right-aligned, '0'-padded
    ok = (x & _U(_F0)) == _U(_ASCII0)
    ok &= ((x + _U(0x0606060606060606)) & _U(_F0)) == _U(_ASCII0)
    ok &= (d >= 1) & (n <= 8)
    # Lemire's 8-digit SWAR parse (byte 0 = most significant digit)
    x &= _U(_NIB)
    x = (x * _U(2561)) >> _U(8)
    x &= _U(0x00FF00FF00FF00FF)
    x = (x * _U(6553601)) >> _U(16)
    x &= _U(0x0000FFFF0000FFFF)
    x = (x * _U(42949672960001)) >> _U(32)
    x[neg] = 0
    val = np.log1p(x.astype(np.float64)).astype(np.float32)
    missing = n == 0
    val[missing] = 0.0
    ok |= missing
    return ok, val


def _decode_hex(w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-hex-digit fields: (ok, missing, uint64 value) from 8-byte windows ``w`` and lengths."""
    hi = w & _U(_HIGH)
    dig = (w + _U(0x50 * _ONES)) & ~(w + _U(0x46 * _ONES))  # 0x30 <= c <= 0x39
    y = w | _U(0x20 * _ONES)
    alpha = (y + _U(0x1F * _ONES)) & ~(y + _U(0x19 * _ONES))  # 0x61 <= c|0x20 <= 0x66
    dig |= alpha
    dig &= _U(_HIGH)
    dig ^= _U(_HIGH)
    dig |= hi
    missing = n == 0
    ok = (dig == 0) & (n == 8)
    ok |= missing
    # nibble values, byte 0 = most significant nibble
    v = (w & _U(_NIB)) + ((w >> _U(6)) & _U(_ONES)) * _U(9)
    v = ((v & _U(0x000F000F000F000F)) << _U(4)) | ((v >> _U(8)) & _U(0x000F000F000F000F))
    v = ((v & _U(0x000000FF000000FF)) << _U(8)) | ((v >> _U(16)) & _U(0x000000FF000000FF))
    v = ((v & _U(0xFFFF)) << _U(16)) | ((v >> _U(32)) & _U(0xFFFF))
    return ok, missing, v


def _parse_block(buf: bytearray, nbytes: int, csv: bool, mod_groups: list) -> _Block:
    """Parse ``buf[:nbytes]``: complete lines, each ending in ``\\n``, followed by >= _PAD bytes."""
    data = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
    words = np.ndarray((nbytes,), dtype="<u8", buffer=buf, strides=(1,))
    if csv:
        mark = data == 44
        mark |= data == 10
        pos = np.flatnonzero(mark)
    else:
        pos = np.flatnonzero(data <= 10)  # tab (9) and newline (10); rarer bytes filtered below
        if len(pos):
            c = data[pos]
            if (c < 9).any():
                pos = pos[c >= 9]
    is_nl = data[pos] == 10
    nl_at = np.flatnonzero(is_nl)
    n_lines = len(nl_at)
    nfields = np.diff(nl_at, prepend=-1)
    fstart = np.empty_like(pos)
    fstart[:1] = 0
    np.add(pos[:-1], 1, out=fstart[1:])
    good = nfields == NUM_FIELDS
    if good.all():
        cand = None
        ends = pos.reshape(n_lines, NUM_FIELDS)
        starts = fstart.reshape(n_lines, NUM_FIELDS)
    else:
        cand = np.flatnonzero(good)
        sel = nl_at[cand][:, None] + np.arange(1 - NUM_FIELDS, 1)
        ends = pos[sel]
        starts = fstart[sel]
    lens = ends - starts
    # strip a "\r" before the "\n"
    last_len = lens[:, -1]
    cr = (data[ends[:, -1] - 1] == 13) & (last_len > 0)
    last_len -= cr

    # label
    n0 = lens[:, 0]
    w0 = words[starts[:, 0]]
    b0 = (w0 & _U(0xFF)) - _U(0x30)  # wraps to huge for bytes < '0'
    lab_ok = (n0 == 1) & (b0 <= _U(1))
    if csv:
        w3 = w0 & _U(0xFFFFFF)
        lab_ok |= (n0 == 3) & ((w3 == _U(0x302E30)) | (w3 == _U(0x302E31)))
    label = b0.astype(np.float32)

    # dense
    dl = lens[:, 1:1 + NUM_DENSE]
    dense_ok, dense = _decode_dense(words[starts[:, 1:1 + NUM_DENSE]], dl)
    if not dense_ok.all():  # rare: long values, unusual zero fractions, bad values
        rr, cc = np.nonzero(~dense_ok)
        for r, c in zip(rr.tolist(), cc.tolist()):
            s = int(starts[r, 1 + c])
            v = _dense_log1p(bytes(buf[s:s + int(dl[r, c])]))
            if v is not None:
                dense[r, c] = v
                dense_ok[r, c] = True

    # categorical
    cl = lens[:, 1 + NUM_DENSE:]
    cat_ok, missing, v = _decode_hex(words[starts[:, 1 + NUM_DENSE:]], cl)
    z = splitmix64(v)
    sparse = np.empty(z.shape, dtype=np.int32)
    for cols, m in mod_groups:
        if cols is None:
            sparse[:] = z % _U(m)
        else:
            sparse[:, cols] = z[:, cols] % _U(m)
    sparse += 1
    sparse[missing] = 0

    ok = lab_ok & dense_ok.all(axis=1) & cat_ok.all(axis=1)
    line_idx = np.arange(len(ok)) if cand is None else cand
    if not ok.all():
        keep = np.flatnonzero(ok)
        label, dense, sparse = label[keep], dense[keep], sparse[keep]
        ok_idx = line_idx[keep]
        good_line = np.zeros(n_lines, dtype=bool)
        good_line[ok_idx] = True
        bad_idx = np.flatnonzero(~good_line)
    else:
        ok_idx = line_idx
        bad_idx = np.flatnonzero(~good) if cand is not None else np.empty(0, dtype=np.int64)

    reasons = []
    if len(bad_idx):
        line_end = pos[nl_at]
        for i in bad_idx[:MAX_EXAMPLES].tolist():
            s = int(line_end[i - 1]) + 1 if i else 0
            try:
                _parse_line(bytes(buf[s:int(line_end[i])]), csv)
            except _Bad as e:
                reasons.append(str(e))
            else:  # the fast path and the rule book disagree: a bug, never silently pass
                raise AssertionError(f"criteo parser inconsistency on line "
                                     f"{bytes(buf[s:int(line_end[i])])!r}")
    return _Block(n_lines, ok_idx, label, dense, sparse, bad_idx, reasons)


# ---------------------------------------------------------------------------------------------
# Files


@dataclass
class _File:
    name: str  # as given, for messages
    path: Path
    csv: bool
    start: int  # byte offset of the first data line
    end: int  # byte offset where data ends (a skipped trailing blank line is beyond it)
    first_line: int  # 1-based line number of the first data line
    lines: int  # data lines


def _scan(name: str, path: Path) -> _File:
    """Detect the layout, check a CSV header, count data lines; reads the file once."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.readline(len(CSV_HEADER) + 3)
        csv = head.startswith(b"label,")
        start, first_line = 0, 1
        if csv:
            hdr = head.rstrip(b"\n")
            hdr = hdr[:-1] if hdr.endswith(b"\r") else hdr
            if hdr != CSV_HEADER or not (head.endswith(b"\n") or f.tell() == size):
                raise CriteoFormatError(
                    f"{name}:1: a CSV header must be exactly {CSV_HEADER.decode()!r}, got "
                    f"{_show(head.rstrip(), 80)}")
            start, first_line = len(head), 2
        f.seek(start)
        newlines = 0
        while chunk := f.read(16 << 20):
            newlines += chunk.count(b"\n")
        lines = newlines
        end = size
        if size > start:
            f.seek(max(start, size - 3))
            tail_off = max(start, size - 3)
            tail = f.read()
            byte = lambda i: tail[i - tail_off] if i >= tail_off else None  # noqa: E731
            if byte(size - 1) != 10:
                lines += 1  # unterminated last line
            # the very last line: skip it if blank ("" or "\r")
            e = size - 1 if byte(size - 1) == 10 else size
            e2 = e - 1 if e > start and byte(e - 1) == 13 else e
            if e2 == start or (e2 - 1 >= tail_off and byte(e2 - 1) == 10):
                lines -= 1
                end = e2
    return _File(name, path, csv, start, end, first_line, lines)


def _blocks(fi: _File, block_bytes: int):
    """Yield (buffer, nbytes, bytes read): whole lines, each ending in ``\\n``, then padding."""
    carry = b""
    remaining = fi.end - fi.start
    unreported = 0
    with open(fi.path, "rb") as f:
        f.seek(fi.start)
        while remaining > 0 or carry:
            want = min(block_bytes, remaining)
            buf = bytearray(len(carry) + want + 1 + _PAD)
            buf[:len(carry)] = carry
            got = f.readinto(memoryview(buf)[len(carry):len(carry) + want]) if want else 0
            remaining -= got
            unreported += got
            end = len(carry) + got
            if remaining <= 0 or got == 0:  # end of data: the last line may lack its "\n"
                remaining = 0
                if end and buf[end - 1] != 10:
                    buf[end] = 10
                    end += 1
                carry = b""
                cut = end
                if not cut:
                    break
            else:
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut == 0:  # a line longer than a block: keep reading
                    carry = bytes(buf[:end])
                    continue
                carry = bytes(buf[cut:end])
            yield buf, cut, unreported
            unreported = 0


def _mod_groups(table_rows: list[int]) -> list:
    sizes = sorted(set(table_rows))
    if len(sizes) == 1:
        return [(None, sizes[0] - 1)]
    return [(np.array([i for i, r in enumerate(table_rows) if r == s]), s - 1) for s in sizes]


def _table_rows(table_size: int, overrides: dict[str, int] | None) -> list[int]:
    rows = [_check_rows(table_size, "table_size")] * NUM_TABLES
    for name, r in (overrides or {}).items():
        if name not in TABLE_NAMES:
            raise ValueError(f"table_size_overrides: unknown table {name!r} (tables are "
                             f"C1..C{NUM_TABLES})")
        rows[TABLE_NAMES.index(name)] = _check_rows(r, name)
    return rows


def convert_criteo(paths, out_dir, *, strict: bool = False, table_size: int = 1_000_000,
                   table_size_overrides: dict[str, int] | None = None,
                   eval_fraction: float = 0.1, overwrite: bool = False,
                   progress: bool = True) -> ConversionReport:
    """Convert Criteo files (read in order, as one time-ordered stream) into ``out_dir``.

    The last ``round(lines * eval_fraction)`` input lines form the "eval" split, the rest
    "train" (bad lines count as lines but write no row). Raises CriteoFormatError for missing,
    unreadable or empty inputs, a bad CSV header, a bad line in strict mode, or if no line at all
    is valid; ValueError for bad arguments; FileExistsError if ``out_dir`` already holds a data set
    and ``overwrite`` is False. All inputs are checked before anything is written; a conversion
    that fails later (strict mode) leaves no meta.json, so the directory reads as incomplete.
    With ``overwrite=True`` the old meta.json and part files are removed first.
    """
    t0 = time.perf_counter()
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise ValueError("no input files given")
    if isinstance(eval_fraction, bool) or not (isinstance(eval_fraction, numbers.Real)
                                               and 0 <= eval_fraction < 1):
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction!r}")
    table_rows = _table_rows(table_size, table_size_overrides)
    out = Path(out_dir)

    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise CriteoFormatError(f"input file(s) not found (or not regular files): "
                                f"{', '.join(missing)}")
    try:
        files = [_scan(str(p), Path(p)) for p in paths]
    except OSError as e:
        raise CriteoFormatError(f"cannot read input: {e}") from e
    total = sum(f.lines for f in files)
    if total == 0:
        raise CriteoFormatError(f"no data lines in {', '.join(f.name for f in files)}")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    prepare_output_dir(out, overwrite)

    n_eval = int(round(total * eval_fraction))
    split_at = total - n_eval  # global line index where eval begins
    mods = _mod_groups(table_rows)
    writers = {"train": SplitWriter(out, "train"), "eval": SplitWriter(out, "eval")}
    examples: list[BadLine] = []
    bad = 0
    g0 = 0  # global index of the next line
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=sum(f.end - f.start for f in files), unit="B", unit_scale=True,
                   desc="criteo", dynamic_ncols=True)
    try:
        with ThreadPoolExecutor(_WORKERS) as pool:
            for fi in files:
                line0 = fi.first_line
                pending: deque = deque()

                def drain(limit: int) -> None:
                    nonlocal bad, g0, line0
                    while len(pending) > limit:
                        fut, consumed = pending.popleft()
                        blk = fut.result()
                        if bar is not None:
                            bar.update(consumed)
                        if len(blk.bad_idx):
                            if strict:
                                raise CriteoFormatError(
                                    f"{fi.name}:{line0 + int(blk.bad_idx[0])}: {blk.reasons[0]}")
                            bad += len(blk.bad_idx)
                            for i, r in zip(blk.bad_idx.tolist(), blk.reasons):
                                if len(examples) < MAX_EXAMPLES:
                                    examples.append(BadLine(fi.name, line0 + i, r))
                        k = int(np.searchsorted(blk.ok_idx, split_at - g0))
                        if k:
                            writers["train"].write(blk.dense[:k], blk.sparse[:k], blk.label[:k])
                        if k < len(blk.ok_idx):
                            writers["eval"].write(blk.dense[k:], blk.sparse[k:], blk.label[k:])
                        g0 += blk.n_lines
                        line0 += blk.n_lines

                for buf, nbytes, consumed in _blocks(fi, BLOCK_BYTES):
                    pending.append((pool.submit(_parse_block, buf, nbytes, fi.csv, mods),
                                    consumed))
                    drain(2 * _WORKERS)
                drain(0)
    finally:
        if bar is not None:
            bar.close()
    if g0 != total:  # the file changed between counting and parsing
        raise CriteoFormatError(f"input changed during conversion: counted {total} lines, "
                                f"parsed {g0}")
    infos: dict[str, SplitInfo] = {k: w.close() for k, w in writers.items()}
    rows = infos["train"].rows + infos["eval"].rows
    if rows == 0:
        raise CriteoFormatError(f"all {total} lines of {', '.join(f.name for f in files)} are "
                                f"bad; first: {examples[0].path}:{examples[0].line}: "
                                f"{examples[0].reason}")
    write_meta(out, table_rows=table_rows, splits=infos, synthetic=None, source={
        "kind": "criteo", "files": [f.name for f in files], "lines": total, "bad_lines": bad,
        "bad_line_examples": [asdict(e) for e in examples]})
    return ConversionReport(lines=total, rows_written=rows, bad_lines=bad, examples=examples,
                            train_rows=infos["train"].rows, eval_rows=infos["eval"].rows,
                            seconds=time.perf_counter() - t0)
