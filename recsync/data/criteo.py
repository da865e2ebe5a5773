"""Convert Criteo click logs (Kaggle / Terabyte raw TSV, or DeepCTR's CSV) into the binary format:
the conversion driver (:func:`convert_criteo`), input file handling and the report.

* Raw Kaggle / Terabyte: tab-separated, no header.
* DeepCTR sample CSV: comma-separated, first line ``label,I1,...,I13,C1,...,C26``. The layout is
  detected per file from its first line: a line starting with ``label,`` is the CSV header (it
  must then be exactly that header), anything else is the TSV layout. Quoted CSV fields are not
  supported (a quote is just a bad character).

The field rules are in :mod:`recsync.data.criteo_rules`. Bad lines are skipped and counted; the
first 10 are reported as (file, 1-based line number, reason). With ``strict=True`` the first bad
line raises :class:`CriteoFormatError` ``"path:17: expected 40 fields, got 39"``.

Speed: the file's bytes are read in blocks (a few MB each, cut at a newline) which are parsed by
:mod:`recsync.data.criteo_block_parser` on a small thread pool (numpy releases the GIL), so memory
stays bounded and a 2-core machine converts several hundred thousand lines per second.
"""

from __future__ import annotations

import numbers
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from recsync.data.criteo_block_parser import MAX_EXAMPLES, PAD, mod_groups, parse_block
from recsync.data.criteo_rules import (CSV_HEADER, TABLE_NAMES, CriteoFormatError, check_rows,
                                       show_bytes)
from recsync.data.format import (NUM_TABLES, SplitInfo, SplitWriter, prepare_output_dir,
                                 write_meta)

BLOCK_BYTES = 2 << 20  # bytes per parsed block (fastest on 2 cores); tests shrink it
_WORKERS = max(1, min(4, os.cpu_count() or 1))


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
                    f"{show_bytes(head.rstrip(), 80)}")
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
            else:
                cut = buf.rfind(b"\n", 0, end) + 1
                if cut == 0:  # a line longer than a block: keep reading
                    carry = bytes(buf[:end])
                    continue
                carry = bytes(buf[cut:end])
            yield buf, cut, unreported
            unreported = 0


def _table_rows(table_size: int, overrides: dict[str, int] | None) -> list[int]:
    rows = [check_rows(table_size, "table_size")] * NUM_TABLES
    for name, r in (overrides or {}).items():
        if name not in TABLE_NAMES:
            raise ValueError(f"table_size_overrides: unknown table {name!r} (tables are "
                             f"C1..C{NUM_TABLES})")
        rows[TABLE_NAMES.index(name)] = check_rows(r, name)
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
    mods = mod_groups(table_rows)
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
                    pending.append((pool.submit(parse_block, buf, nbytes, fi.csv, mods),
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
