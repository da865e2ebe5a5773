"""Criteo input files: opened plain or decompressed (gzip, bz2, xz: detected by their first
bytes, not their names), scanned once for the layout and the line count, then read again in
blocks of whole lines for the block parser.

Compressed files are streamed: nothing is decompressed to disk, and memory stays at a block.
A zstd or zip file is refused with a message that names it, rather than parsed as text.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from recsync.data import convert_input  # MAX_LINE_BYTES: one bound for every text input
from recsync.data.criteo_block_parser import PAD
from recsync.data.criteo_rules import CSV_HEADER, CriteoFormatError, show_bytes
from recsync.data.format import one_line

# what reading a broken file can raise: I/O errors, a truncated or corrupt compressed stream
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
_DECOMPRESSED = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))
_REFUSED = ((b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))


def open_input(name: str, path: Path) -> BinaryIO:
    """``path`` opened for reading its (decompressed) bytes; ``name`` is for messages."""
    with open(path, "rb") as f:
        magic = f.read(6)
    for prefix, opener in _DECOMPRESSED:
        if magic.startswith(prefix):
            return opener(path, "rb")
    for prefix, kind in _REFUSED:
        if magic.startswith(prefix):
            raise CriteoFormatError(f"{name}: a {kind} file; decompress it first (gzip, bz2 and "
                                    f"xz files are read directly)")
    return open(path, "rb")


@dataclass
class InputFile:
    name: str  # as given, for messages
    path: Path
    csv: bool
    start: int  # offset of the first data line in the (decompressed) bytes
    end: int  # offset where data ends (a skipped trailing blank line is beyond it)
    first_line: int  # 1-based line number of the first data line
    lines: int  # data lines


def scan(name: str, path: Path) -> InputFile:
    """Detect the layout, check a CSV header, count data lines; reads the file once.
    Raises CriteoFormatError naming the file if it cannot be read."""
    try:
        return _scan(name, path)
    except READ_ERRORS as e:
        raise CriteoFormatError(f"{name}: cannot be read ({one_line(e)})") from e


def _scan(name: str, path: Path) -> InputFile:
    with open_input(name, path) as f:
        head = f.readline(len(CSV_HEADER) + 3)
        csv = head.startswith(b"label,")
        start, first_line = 0, 1
        if csv:
            hdr = head.rstrip(b"\n")
            hdr = hdr[:-1] if hdr.endswith(b"\r") else hdr
            if hdr != CSV_HEADER:
                raise CriteoFormatError(
                    f"{name}:1: a CSV header must be exactly {CSV_HEADER.decode()!r}, got "
                    f"{show_bytes(head.rstrip(), 80)}")
            start, first_line = len(head), 2
        size, newlines, last = len(head), head[start:].count(b"\n"), head[-3:]
        while chunk := f.read(16 << 20):
            size += len(chunk)
            newlines += chunk.count(b"\n")
            last = (last + chunk[-3:])[-3:]
    lines, end = newlines, size
    if size > start:
        tail_off = max(start, size - 3)

        def byte(i):  # the byte at offset i, if among the last three after the header
            return last[i - (size - len(last))] if i >= tail_off else None

        if byte(size - 1) != 10:
            lines += 1  # unterminated last line
        # the very last line: skip it if blank ("" or "\r")
        e = size - 1 if byte(size - 1) == 10 else size
        e2 = e - 1 if e > start and byte(e - 1) == 13 else e
        if e2 == start or (e2 - 1 >= tail_off and byte(e2 - 1) == 10):
            lines -= 1
            end = e2
    return InputFile(name, path, csv, start, end, first_line, lines)


def blocks(fi: InputFile, block_bytes: int):
    """Yield (buffer, nbytes, bytes read): whole lines, each ending in ``\\n``, then padding.
    Raises CriteoFormatError naming the file if it cannot be read (errors of the consumer's
    own work never pass through a generator, so they are not mislabelled here)."""
    try:
        yield from _blocks(fi, block_bytes)
    except READ_ERRORS as e:
        raise CriteoFormatError(f"{fi.name}: cannot be read ({one_line(e)})") from e


def _blocks(fi: InputFile, block_bytes: int):
    carry = b""
    remaining = fi.end - fi.start
    unreported = done = 0  # done: bytes of whole lines yielded
    with open_input(fi.name, fi.path) as f:
        f.read(fi.start)  # the CSV header: a few bytes (a compressed stream cannot seek cheaply)
        while remaining > 0 or carry:
            want = min(block_bytes, remaining)
            buf = bytearray(len(carry) + want + 1 + PAD)
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
            else:  # (a decompressing reader may return less than asked: same as a cut block)
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut == 0:  # a line longer than a block: keep reading, up to the bound
                    if end > convert_input.MAX_LINE_BYTES:
                        raise CriteoFormatError(
                            f"{fi.name}: a line at byte {fi.start + done:,} is longer than "
                            f"{convert_input.MAX_LINE_BYTES:,} bytes (MAX_LINE_BYTES): not "
                            f"Criteo text")
                    carry = bytes(buf[:end])
                    continue
                done += cut
                carry = bytes(buf[cut:end])
            yield buf, cut, unreported
            unreported = 0
