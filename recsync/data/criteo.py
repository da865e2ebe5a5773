"""Convert Criteo click logs (Kaggle / Terabyte raw TSV, or DeepCTR's CSV) into the binary format:
the conversion driver (:func:`convert_criteo`) and its report. Input files (plain or compressed)
are read by :mod:`recsync.data.criteo_input`; the output is staged by :mod:`recsync.data.output`.

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

from recsync.data.criteo_block_parser import MAX_EXAMPLES, mod_groups, parse_block
from recsync.data.criteo_input import InputFile, blocks, scan
from recsync.data.criteo_rules import TABLE_NAMES, CriteoFormatError, check_rows
from recsync.data.format import NUM_TABLES, SplitInfo, SplitWriter, write_meta
from recsync.data.output import check_target, staged_output

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

    Inputs may be plain, gzip, bz2 or xz files (detected by their first bytes). The last
    ``round(lines * eval_fraction)`` input lines form the "eval" split, the rest "train" (bad
    lines count as lines but write no row). Raises CriteoFormatError for missing, unreadable,
    empty or zstd/zip inputs, a bad CSV header, a bad line in strict mode, or if no line at all is
    valid; ValueError for bad arguments; FileExistsError if ``out_dir`` holds a data set and not
    ``overwrite``, or holds anything that is not a data set (see data/output.py).

    The data set is written into a temporary directory beside ``out_dir`` and replaces it only
    when complete: whatever fails, or on Ctrl-C, ``out_dir`` is left exactly as it was.
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
    check_target(out, overwrite)  # before reading the inputs, which may take minutes

    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise CriteoFormatError(f"input file(s) not found (or not regular files): "
                                f"{', '.join(missing)}")
    files = [scan(str(p), Path(p)) for p in paths]
    total = sum(f.lines for f in files)
    if total == 0:
        raise CriteoFormatError(f"no data lines in {', '.join(f.name for f in files)}")
    with staged_output(out, overwrite) as tmp:
        report = _convert(files, tmp, table_rows, strict=strict, eval_fraction=eval_fraction,
                          progress=progress)
    report.seconds = time.perf_counter() - t0
    return report


def _convert(files: list[InputFile], out: Path, table_rows: list[int], *, strict: bool,
             eval_fraction: float, progress: bool) -> ConversionReport:
    """Parse ``files`` (already scanned) and write the data set, meta.json last, into ``out``."""
    total = sum(f.lines for f in files)
    n_eval = int(round(total * eval_fraction))
    split_at = total - n_eval  # global line index where eval begins
    mods = mod_groups(table_rows)
    writers = {"train": SplitWriter(out, "train"), "eval": SplitWriter(out, "eval")}
    examples: list[BadLine] = []
    bad = 0
    g0 = 0  # global index of the next line
    bar = None
    if progress:
        from recsync.progress import progress as bar_or_lines
        bar = bar_or_lines(sum(f.end - f.start for f in files), "B", "criteo",
                           dynamic_ncols=True)
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

                for buf, nbytes, consumed in blocks(fi, BLOCK_BYTES):
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
                            seconds=0.0)
