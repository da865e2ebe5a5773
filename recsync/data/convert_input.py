"""Input files of ``recsync data convert``: what each is (CSV/TSV text, plain or compressed, or
Parquet), its columns, and its records streamed in bounded pieces.

* Kind and compression are detected from the first bytes, not the name: Parquet (``PAR1``),
  gzip, bzip2, zstd, xz, else plain text (a zip archive is refused, naming the file).
  Compressed text is decompressed as a stream (by pyarrow; xz by Python's lzma): nothing is
  written to disk and memory stays at a block.
* Text is cut into blocks of whole lines (``block_bytes`` each, cut at a newline) that the
  parser reads independently, so the 1-based line number of every record is known exactly
  (a quoted field must not contain a line end: convert_csv refuses it). Blank lines at the end
  of a file are ignored; a blank line elsewhere is a bad row. A line (or a run of blank lines)
  longer than ``MAX_LINE_BYTES`` is refused: memory stays within a few times that bound and the
  time linear in the file, whatever it holds.
* Parquet is read a row group at a time (``iter_batches``), only the columns the schema reads.
"""

from __future__ import annotations

import csv
import fnmatch
import lzma
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsync.data.format import one_line
from recsync.data.schema import Schema
from recsync.safe_names import printable

MAX_LINE_BYTES = 64 << 20  # docs/data.md "Inputs"; tests lower it


class ConvertError(ValueError):
    """An input cannot be converted with this schema; one line naming the file (and the line
    and column where there is one). Control characters of the message (a quoted value, a
    file name) are escaped: what an input holds never reaches a terminal raw."""

    def __init__(self, message: str):
        super().__init__(printable(message, 4000))


_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"\xfd7zXZ\x00", "xz"))
_PARQUET = b"PAR1"
_ZIP = b"PK\x03\x04"
# what reading a broken file can raise: I/O errors, a truncated or corrupt compressed stream
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, pa.ArrowException)


@dataclass
class Source:
    name: str  # as given, for messages
    path: Path
    kind: str  # "text" or "parquet"
    compression: str | None  # text only: "gzip", "bz2", "zstd", "xz" or None
    size_bytes: int  # on disk (progress counts these)
    columns: list[str]  # the header, the schema's input.columns, or the Parquet column names
    first_line: int  # text: 1-based line number of the first data line (2 after a header)
    header_bytes: int  # text: bytes (decompressed) before the first data line
    eval: bool  # matched split.eval_files: every row of it is eval


@dataclass
class TextBlock:
    data: bytes  # whole lines, the last ending in "\n"
    line0: int  # 1-based line number of the first
    lines: int
    read_bytes: int  # bytes of the file on disk consumed since the previous block


def open_source(name: str, schema: Schema) -> Source:
    """Detect the kind of input ``name`` and read its header; ConvertError if it is missing,
    unreadable or empty."""
    path = Path(name)
    if not path.is_file():
        raise ConvertError(f"{name}: input file not found (or not a regular file)")
    pats = schema.split.eval_files
    is_eval = any(fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(name, p) for p in pats)
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        size = path.stat().st_size
        if size == 0:
            raise ConvertError(f"{name}: empty file")
        if magic.startswith(_ZIP):
            raise ConvertError(f"{name}: a zip archive; unzip it first (gzip, bz2, zstd and xz "
                               f"files are read directly)")
        if magic.startswith(_PARQUET):
            return Source(name, path, "parquet", None, size, _parquet_columns(name, path), 0, 0,
                          is_eval)
        comp = next((c for m, c in _MAGIC if magic.startswith(m)), None)
        src = Source(name, path, "text", comp, size, [], 1, 0, is_eval)
        _read_header(src, schema)
        return src
    except READ_ERRORS as e:
        raise ConvertError(f"{name}: cannot be read ({one_line(e)})") from e


def _parquet_columns(name: str, path: Path) -> list[str]:
    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except pa.ArrowException as e:
        raise ConvertError(f"{name}: not a readable Parquet file ({one_line(e)})") from e


def _stream(src: Source):
    """(raw file, decompressed stream): the raw file's position is the progress."""
    raw = pa.OSFile(str(src.path), "rb")
    if src.compression is None:
        return raw, raw
    if src.compression == "xz":  # not among pyarrow's codecs
        return raw, lzma.LZMAFile(raw)
    return raw, pa.CompressedInputStream(raw, src.compression)


def _read_header(src: Source, schema: Schema) -> None:
    raw, stream = _stream(src)
    with raw, stream:
        pieces, size = [], 0
        while True:
            chunk = stream.read(1 << 20)
            pieces.append(chunk)
            size += len(chunk)
            if not chunk or b"\n" in chunk:
                break
            if size > MAX_LINE_BYTES:
                raise long_line(src.name, 1)
        head = b"".join(pieces)
    if head.find(b"\n") > MAX_LINE_BYTES:
        raise long_line(src.name, 1)
    bom = 3 if head.startswith(b"\xef\xbb\xbf") else 0
    if not head[bom:].strip(b"\r\n"):
        raise ConvertError(f"{src.name}: empty file (no lines)")
    if not schema.input.header:
        src.columns = list(schema.input.columns)
        src.header_bytes = bom
        return
    end = head.find(b"\n")
    line = head[bom:end if end >= 0 else len(head)].rstrip(b"\r")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ConvertError(f"{src.name}:1: the header is not UTF-8 text") from None
    try:
        src.columns = next(csv.reader([text], delimiter=schema.input.delimiter))
    except csv.Error as e:  # a field over the csv module's limit (128 KB)
        raise ConvertError(f"{src.name}:1: the header cannot be read ({e})") from None
    src.header_bytes = end + 1 if end >= 0 else len(head)
    src.first_line = 2


def head_bytes(src: Source, n: int) -> bytes:
    """Up to ``n`` of the first (decompressed) bytes of a text input."""
    try:
        raw, stream = _stream(src)
        with raw, stream:
            return stream.read(n)
    except READ_ERRORS as e:
        raise ConvertError(f"{src.name}: cannot be read ({one_line(e)})") from e


def check_columns(sources: list[Source], schema: Schema, keys: dict[str, str]) -> None:
    """Every input holds the schema's columns (``keys``: column -> the schema key naming it)
    once, and text inputs with a header all have the same header."""
    first = next((s for s in sources if s.kind == "text" and schema.input.header), None)
    for s in sources:
        if s is not first and first is not None and s.kind == "text" and s.columns != first.columns:
            diff = next((i for i, (a, b) in enumerate(zip(s.columns, first.columns)) if a != b),
                        min(len(s.columns), len(first.columns)))
            got = s.columns[diff] if diff < len(s.columns) else "(none)"
            want = first.columns[diff] if diff < len(first.columns) else "(none)"
            raise ConvertError(f"{s.name}:1: the header differs from {first.name}'s: column "
                               f"{diff + 1} is {got!r}, not {want!r}")
        where = "header" if s.kind == "text" and schema.input.header else "columns"
        check_names(s.name, s.columns, keys, where)


def check_names(name: str, columns: list[str], keys: dict[str, str], where: str) -> None:
    """Input ``name``'s ``columns`` hold each of ``keys`` (column -> the schema key naming it)
    exactly once; ``where``: what lists the columns ("header", "columns")."""
    for col, key in keys.items():
        n = columns.count(col)
        if n == 0:
            raise ConvertError(f"{name}: column {col!r} ({key} in the schema) is not in "
                               f"its {where} ({', '.join(columns)[:200]})")
        if n > 1:
            raise ConvertError(f"{name}: column {col!r} ({key}) appears {n} times in its "
                               f"{where}")


def text_blocks(src: Source, block_bytes: int) -> Iterator[TextBlock]:
    """The data lines of a text input in blocks of whole lines; ConvertError naming the file if
    it cannot be read (a truncated or corrupt compressed stream included)."""
    try:
        yield from _text_blocks(src, block_bytes)
    except READ_ERRORS as e:
        raise ConvertError(f"{src.name}: cannot be read ({one_line(e)})") from e


def long_line(name: str, line: int, what: str = "a line") -> ConvertError:
    return ConvertError(f"{name}:{line}: {what} longer than {MAX_LINE_BYTES:,} bytes "
                        f"(MAX_LINE_BYTES): not CSV or TSV text this reader can take (lines "
                        f"end with \\n or \\r\\n)")


def _text_blocks(src: Source, block_bytes: int) -> Iterator[TextBlock]:
    raw, stream = _stream(src)
    with raw, stream:
        skip = src.header_bytes
        while skip:  # the header (a compressed stream cannot seek)
            got = len(stream.read(min(skip, 1 << 20)))
            if not got:
                break
            skip -= got
        # held: what follows the last block, kept as read (no copy per chunk: linear time):
        # complete blank lines (`nl` of them), then an unfinished line of `tail` bytes
        held: list[bytes] = []
        size = nl = tail = 0
        tail_blank, line, reported = True, src.first_line, 0
        while True:
            chunk = stream.read(block_bytes)
            if not chunk:  # end of file: trailing blank lines are dropped
                body = b"".join(held).rstrip(b"\r\n")
                if body:
                    block = body + b"\n"
                    yield TextBlock(block, line, block.count(b"\n"), raw.tell() - reported)
                return
            last = chunk.rfind(b"\n")
            if last < 0:  # the unfinished line goes on
                held.append(chunk)
                size, tail = size + len(chunk), tail + len(chunk)
                tail_blank = tail_blank and chunk.count(b"\r") == len(chunk)
                if tail > MAX_LINE_BYTES:
                    raise long_line(src.name, line + nl)
                continue
            if tail + chunk.find(b"\n") > MAX_LINE_BYTES:
                raise long_line(src.name, line + nl)
            cut = _cut(chunk)  # after the last non-blank line closing in the chunk, if any
            if not cut and not tail_blank:  # the unfinished line, closed, is not blank
                cut = chunk.find(b"\n") + 1
            if not cut:  # only blank lines closed: held back, since at the end they are dropped
                held.append(chunk)
                size += len(chunk)
                nl += chunk.count(b"\n")
            else:
                block = b"".join([*held, memoryview(chunk)[:cut]])  # one copy, not two
                pos = raw.tell()
                n = int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == 10))
                yield TextBlock(block, line, n, pos - reported)
                line, reported = line + n, pos
                held, size, nl = [chunk[cut:]], len(chunk) - cut, chunk.count(b"\n", cut)
            tail = len(chunk) - last - 1
            tail_blank = chunk.count(b"\r", last + 1) == tail
            if size - tail > MAX_LINE_BYTES:
                raise long_line(src.name, line, "a run of blank lines")


def _cut(buf: bytes) -> int:
    """Offset just after the last line end that closes a non-blank line (0 if none; the first
    line counts from offset 0): blank lines after it wait for the next block, since at the end
    of the file they are dropped. A line is blank when it holds nothing but carriage returns."""
    last = buf.rfind(b"\n")
    if last <= 0:
        return 0
    if buf[last - 1] not in b"\r\n":  # the usual case: the last line is not blank
        return last + 1
    k = len(buf[:last].rstrip(b"\r\n"))  # buf[k - 1]: the last byte of a non-blank line
    return buf.find(b"\n", k - 1) + 1 if k else 0


def count_records(src: Source) -> int:
    """Data lines of a text input (exactly as text_blocks yields them: trailing blank lines
    not counted), or rows of a Parquet file. Reads the file once, in large pieces."""
    if src.kind == "parquet":
        return pq.ParquetFile(src.path).metadata.num_rows
    try:
        raw, stream = _stream(src)
        with raw, stream:
            skip = src.header_bytes
            newlines = tail = 0  # tail: line ends in the trailing run of "\r" and "\n"
            body = False
            while chunk := stream.read(16 << 20):
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                newlines += int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == 10))
                kept = len(chunk.rstrip(b"\r\n"))
                if kept:
                    body, tail = True, chunk.count(b"\n", kept)
                else:
                    tail += chunk.count(b"\n")
        return newlines - tail + body
    except READ_ERRORS as e:
        raise ConvertError(f"{src.name}: cannot be read ({one_line(e)})") from e


def parquet_types(src: Source) -> dict:
    """Column name -> Arrow type of a Parquet input."""
    try:
        return {f.name: f.type for f in pq.ParquetFile(src.path).schema_arrow}
    except READ_ERRORS as e:
        raise ConvertError(f"{src.name}: cannot be read ({one_line(e)})") from e


def parquet_batches(src: Source, columns: list[str], batch_rows: int):
    """Yield (record batch, row group, first row's index in the group, bytes on disk done)."""
    try:
        pf = pq.ParquetFile(src.path)
        meta = pf.metadata
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            size = sum(rg.column(i).total_compressed_size for i in range(rg.num_columns))
            row = 0
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g],
                                         columns=columns, use_threads=False):
                yield batch, g, row, size * batch.num_rows // max(rg.num_rows, 1)
                row += batch.num_rows
    except READ_ERRORS as e:
        raise ConvertError(f"{src.name}: cannot be read ({one_line(e)})") from e
