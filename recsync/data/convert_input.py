"""Input files of ``recsync data convert``: what each is (CSV/TSV text, plain or compressed, or
Parquet), its columns, and its records streamed in bounded pieces.

* Kind and compression are detected from the first bytes, not the name: Parquet (``PAR1``),
  gzip, bzip2, zstd, else plain text. Compressed text is decompressed by pyarrow as a stream:
  nothing is written to disk and memory stays at a block.
* Text is cut into blocks of whole lines (``block_bytes`` each, cut at a newline) that the
  parser reads independently, so the 1-based line number of every record is known exactly
  (quoted fields must not contain newlines, as in pyarrow's default). Blank lines at the end of
  a file are ignored; a blank line elsewhere is a bad row.
* Parquet is read a row group at a time (``iter_batches``), only the columns the schema reads.
"""

from __future__ import annotations

import csv
import fnmatch
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recsync.data.format import one_line
from recsync.data.schema import Schema


class ConvertError(ValueError):
    """An input cannot be converted with this schema; one line naming the file (and the line
    and column where there is one)."""


_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\x28\xb5\x2f\xfd", "zstd"))
_PARQUET = b"PAR1"
READ_ERRORS = (OSError, pa.ArrowException)


@dataclass
class Source:
    name: str  # as given, for messages
    path: Path
    kind: str  # "text" or "parquet"
    compression: str | None  # text only: "gzip", "bz2", "zstd" or None
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
            magic = f.read(4)
        size = path.stat().st_size
        if size == 0:
            raise ConvertError(f"{name}: empty file")
        if magic == _PARQUET:
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
    return raw, pa.CompressedInputStream(raw, src.compression)


def _read_header(src: Source, schema: Schema) -> None:
    raw, stream = _stream(src)
    with raw, stream:
        head = b""
        while b"\n" not in head:
            chunk = stream.read(1 << 16)
            if not chunk:
                break
            head += chunk
            if len(head) > 1 << 24:
                raise ConvertError(f"{src.name}:1: no line end in the first 16 MB (not a CSV "
                                   f"file?)")
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
    src.columns = next(csv.reader([text], delimiter=schema.input.delimiter))
    src.header_bytes = end + 1 if end >= 0 else len(head)
    src.first_line = 2


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


def _text_blocks(src: Source, block_bytes: int) -> Iterator[TextBlock]:
    raw, stream = _stream(src)
    with raw, stream:
        skip = src.header_bytes
        while skip:  # the header (a compressed stream cannot seek)
            got = len(stream.read(min(skip, 1 << 20)))
            if not got:
                break
            skip -= got
        carry, line, reported = b"", src.first_line, 0
        while True:
            chunk = stream.read(block_bytes)
            buf = carry + chunk if carry else chunk
            if not chunk:  # end of file: trailing blank lines are dropped
                body = buf.rstrip(b"\r\n")
                if body:
                    block = body + b"\n"
                    yield TextBlock(block, line, block.count(b"\n"), raw.tell() - reported)
                return
            cut = _cut(buf)
            if cut == 0:  # no complete non-blank line yet: keep reading
                carry = buf
                continue
            block, carry = buf[:cut], buf[cut:]
            pos = raw.tell()
            n = block.count(b"\n")
            yield TextBlock(block, line, n, pos - reported)
            line, reported = line + n, pos


def _cut(buf: bytes) -> int:
    """Offset just after the last line end that closes a non-blank line (0 if none): blank
    lines after it wait for the next block, since at the end of the file they are dropped."""
    end = buf.rfind(b"\n")
    while end >= 0:
        start = buf.rfind(b"\n", 0, end) + 1
        if buf[start:end].strip(b"\r"):
            return end + 1
        end = start - 1
    return 0


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
                newlines += chunk.count(b"\n")
                kept = len(chunk.rstrip(b"\r\n"))
                if kept:
                    body, tail = True, chunk.count(b"\n", kept)
                else:
                    tail += chunk.count(b"\n")
        return newlines - tail + body
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
