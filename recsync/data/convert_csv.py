"""A block of text lines read by pyarrow's CSV reader (the path for any block that
convert_fast.py declines), guarded so that one record is one line, whatever the bytes.

* A line with a carriage return that does not end it is a bad row: the reader would cut the
  record there, and every later row of the block would be named by the wrong line.
* A quoted field that does not close on its line (a line end inside quotes, or a quote never
  closed) stops the conversion with :class:`LineError`, naming that line: from there on lines
  and records no longer match, and a guess could turn one record into wrong rows.
* A row of the wrong field count is handed to the reader's handler as UTF-8 text; in a block
  that is not UTF-8 such rows are given ASCII bytes first (the reader would otherwise print
  "Exception ignored" tracebacks and fail with the raw bytes in its message).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from recsync.data.convert_parse import Plan

BARE_CR = "a carriage return inside the line (lines end with \\n or \\r\\n)"
OPEN_QUOTE = ("a quoted field does not close on its line (a line end inside quotes, or a quote "
              "never closed); recsync reads one record per line")


class LineError(ValueError):
    """Line ``index`` (0-based in its block) cannot be read, for reason ``why``; the caller
    names the file and line."""

    def __init__(self, index: int, why: str):
        super().__init__(index, why)
        self.index, self.why = index, why


def read_text_block(data: bytes, names: list[str], plan: Plan, delimiter: str):
    """A block of whole lines -> (table of the plan's columns, invalid records as
    [(index, reason)]): rows whose field count is wrong are left out of the table. Raises
    LineError at a quoted field that does not close on its line.

    Numeric columns (label, weight, dense) are parsed as float64 by the CSV reader; if a value
    in the block is not a number the block is read again with every column as bytes, and
    :func:`parse` finds the bad rows. Other columns are bytes (hashed as they are)."""
    lines = data.count(b"\n")
    numeric, cols = plan.numeric_columns(), plan.columns()
    data, replaced = _guard(data, names, cols[:1], delimiter, lines)
    try:
        table, invalid = _read_csv(data, names, cols, delimiter, numeric)
    except pa.ArrowInvalid:
        table, invalid = _read_csv(data, names, cols, delimiter, ())
    if table.num_rows + len(invalid) != lines:
        raise LineError(_first_open_quote(data, names, cols[:1], delimiter), OPEN_QUOTE)
    if b'"' in data and _last_line_open(data, names, cols[:1], delimiter):
        raise LineError(lines - 1, OPEN_QUOTE)  # the next block would start inside the field
    if replaced:
        invalid = [(i, replaced.get(i, why)) for i, why in invalid]
    return table, invalid


def _guard(data: bytes, names: list[str], probe: list[str], delimiter: str, lines: int):
    """(the block as the CSV reader may read it, {line index: reason} of lines made invalid).

    A line with a bare carriage return (one that does not end the line) is overwritten by one
    of the wrong field count, so it is a bad row: the reader would cut it in two. And the
    reader hands a row of the wrong field count to the handler as UTF-8 text, failing with
    "Exception ignored" and the raw bytes if it is not: in a block that is not UTF-8, such rows
    (found on a copy whose non-ASCII bytes are replaced, same structure) get that copy's
    bytes. The other rows keep their bytes, which are hashed as they are. ``probe``: the one
    column the structure parses read (a schema's: its name is once in ``names``)."""
    arr, reasons = None, {}
    crs = data.count(b"\r")
    if crs and crs != data.count(b"\r\n"):
        arr = np.frombuffer(data, dtype=np.uint8).copy()
        nl = np.flatnonzero(arr == 10)
        at = np.flatnonzero(arr == 13)
        bad = np.unique(np.searchsorted(nl, at[arr[at + 1] != 10]))  # a "\r" is never last
        starts, ends = np.concatenate([[0], nl[:-1] + 1])[bad], nl[bad]
        other = ord("y" if delimiter == "x" else "x")  # one field
        fill = np.where(ends - starts + 1 == len(names), other, ord(delimiter))
        arr[_spans(len(arr), starts, ends)] = np.repeat(fill.astype(np.uint8), ends - starts)
        reasons = dict.fromkeys(bad.tolist(), BARE_CR)
    block = data if arr is None else arr.tobytes()
    if block.isascii():
        return block, reasons
    try:
        block.decode("utf-8")
        return block, reasons
    except UnicodeDecodeError:
        pass
    text = _ascii(block, delimiter)
    table, invalid = _read_csv(text, names, probe, delimiter, ())
    if table.num_rows + len(invalid) != lines:
        raise LineError(_first_open_quote(text, names, probe, delimiter), OPEN_QUOTE)
    if not invalid:
        return block, reasons
    arr, sane = np.frombuffer(block, dtype=np.uint8).copy(), np.frombuffer(text, dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    bad = np.array([i for i, _ in invalid])
    mask = _spans(len(arr), np.concatenate([[0], nl[:-1] + 1])[bad], nl[bad])
    arr[mask] = sane[mask]
    return arr.tobytes(), reasons


def _ascii(data: bytes, delimiter: str) -> bytes:
    """``data`` with every non-ASCII byte replaced by an ASCII one that is not the delimiter:
    the same fields, quotes and lines, and valid UTF-8."""
    fill = b"-" if delimiter == "_" else b"_"
    return data.translate(bytes(range(128)) + fill * 128)


def _spans(n: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """bool [n]: inside one of the disjoint, ascending ranges [starts[i], ends[i])."""
    mark = np.zeros(n + 1, dtype=np.int8)
    np.add.at(mark, starts, 1)
    np.add.at(mark, ends, -1)
    return np.cumsum(mark[:-1], dtype=np.int64) > 0


def _first_open_quote(data: bytes, names: list[str], probe: list[str], delimiter: str) -> int:
    """The first line (0-based) whose quoted field runs past its end: the reader gives the
    first k lines k records for every k up to it and one, and fewer from two after it on, so
    a bisection on prefixes finds it with the reader's own quoting rules."""
    nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)

    def records(k: int) -> int:
        table, invalid = _read_csv(data[:nl[k - 1] + 1], names, probe, delimiter, ())
        return table.num_rows + len(invalid)

    lo, hi = 1, len(nl)  # records(lo) == lo; records(hi) < hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if records(mid) < mid:
            hi = mid
        else:
            lo = mid
    return max(hi - 2, 0)


def _last_line_open(data: bytes, names: list[str], probe: list[str], delimiter: str) -> bool:
    """Whether the block's last line ends inside a quoted field (the end of the block closes
    it for the reader): a line after it is then read as part of the same record."""
    last = _ascii(data[data.rfind(b"\n", 0, len(data) - 1) + 1:], delimiter)
    table, invalid = _read_csv(last + b"x\n", names, probe, delimiter, ())
    return table.num_rows + len(invalid) < 2


def _read_csv(data: bytes, names: list[str], cols: list[str], delimiter: str, numeric):
    invalid: list[tuple[int, str]] = []

    def handler(row):
        invalid.append((row.number - 1, f"expected {row.expected_columns} fields, got "
                                         f"{row.actual_columns}"))
        return "skip"

    types = {c: pa.float64() if c in numeric else pa.binary() for c in cols}
    table = pcsv.read_csv(
        pa.py_buffer(data),
        read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                      block_size=len(data) + 1),  # one chunk
        parse_options=pcsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=False,
                                        invalid_row_handler=handler),
        convert_options=pcsv.ConvertOptions(include_columns=cols, column_types=types,
                                            null_values=[""], strings_can_be_null=True))
    return table, invalid
