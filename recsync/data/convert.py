"""``recsync data convert``: CSV/TSV (plain, gzip, bzip2 or zstd) or Parquet files described by a
schema (recsync/data/schema.py, or a shipped preset) into the data format (format.py).

The driver: inputs are opened and checked against the schema (convert_input.py), then read in
bounded pieces parsed on a small thread pool (convert_parse.py) and written in input order.
Up to three passes over the inputs, each streamed:

1. count the records, only for an ``eval_fraction`` split of text inputs (the last fraction of
   the records is eval, so where it begins must be known first; Parquet says its row count);
2. fit the statistics of ``standardize`` features on the train rows, only if there are such;
3. convert.

The data set is written into a temporary directory beside ``out_dir`` (data/output.py): a
failure, a bad row in strict mode or Ctrl-C leaves ``out_dir`` exactly as it was.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from recsync.data.convert_csv import LineError, read_text_block
from recsync.data.convert_fast import fast_block
from recsync.data.convert_input import (ConvertError, Source, check_columns, open_source,
                                        parquet_batches, parquet_types, text_blocks)
from recsync.data.convert_parse import MAX_EXAMPLES, Parsed, Plan, check_types, merge_stats, parse
from recsync.data.format import Feature, Layout, SplitWriter, Table, one_line, write_meta
from recsync.data.output import check_target, staged_output
from recsync.data.schema import Schema, load_schema

BLOCK_BYTES = 2 << 20  # bytes of text per parsed piece (fastest: fits the caches); tests shrink it
BATCH_ROWS = 65_536  # Parquet rows per parsed piece
PART_ROWS = 1_000_000
_WORKERS = max(1, min(4, len(os.sched_getaffinity(0))))  # the cores this process may use
HASH_NAME = "fnv1a64-splitmix64"  # docs/data.md "The hash"; recsync/data/value_hash.py


@dataclass
class BadRow:
    where: str  # "path:17" (1-based line) or "path: row group 0, row 5" (0-based row)
    column: str  # "" for a wrong field count
    reason: str


@dataclass
class ConvertReport:
    lines: int  # records read: text lines after the header, or Parquet rows; bad ones included
    rows_written: int
    bad_lines: int
    examples: list[BadRow]  # the first MAX_EXAMPLES bad rows, in input order
    truncated: int  # multi-hot lists cut to max_len
    train_rows: int
    eval_rows: int
    seconds: float
    preprocessing: dict


def convert(inputs, schema: Schema | str | os.PathLike, out_dir, *, strict: bool = False,
            overwrite: bool = False, progress: bool = True, block_bytes: int = BLOCK_BYTES,
            allow_empty_train: bool = False) -> ConvertReport:
    """Convert ``inputs`` (read in order, as one stream) as ``schema`` says into ``out_dir``.

    Raises ConvertError (one line naming the file, and the line and column where there is one)
    for a missing, unreadable or empty input, a column the schema names but an input lacks,
    headers that differ between inputs, a bad row in strict mode, no good row at all, or no
    train row unless ``allow_empty_train`` (an eval-only data set, to score);
    SchemaError for a bad schema; FileExistsError if ``out_dir`` holds a data set and not
    ``overwrite``, or anything that is not a data set. ``out_dir`` is complete or as it was.
    """
    t0 = time.perf_counter()
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not paths:
        raise ValueError("no input files given")
    if not isinstance(schema, Schema):
        schema = load_schema(schema)
    out = Path(out_dir)
    check_target(out, overwrite)  # before reading the inputs, which may take minutes
    sources = [open_source(str(p), schema) for p in paths]
    check_columns(sources, schema, schema.column_keys())
    plan = Plan.of(schema)
    run = _Run(sources, schema, block_bytes, progress)
    split_at = None
    if schema.split.fraction > 0:
        total = run.count()
        split_at = total - int(round(total * schema.split.fraction))
    fitted = run.fit(plan, split_at) if any(d[2] == "standardize" for d in plan.dense) else {}
    with staged_output(out, overwrite) as tmp:
        report = run.write(tmp, plan, split_at, strict, fitted, allow_empty_train)
    report.seconds = time.perf_counter() - t0
    return report


def layout_of(schema: Schema) -> Layout:
    dims = {name: t.dim for name, t in schema.tables.items()}
    return Layout(
        dense=tuple(d.name for d in schema.dense),
        features=(*(Feature(c.name, c.table or c.name) for c in schema.categorical),
                  *(Feature(m.name, m.table or m.name, pooling=m.pooling, max_len=m.max_len)
                    for m in schema.multi_hot)),
        tables=tuple(Table(t, schema.table_rows(t), dims.get(t),
                           schema.table_kind(t) == "dynamic") for t in schema.table_names()),
        weight=bool(schema.weight))


class _Run:
    """The passes over one list of inputs."""

    def __init__(self, sources: list[Source], schema: Schema, block_bytes: int,
                 progress: bool):
        self.sources, self.schema = sources, schema
        self.block_bytes, self.progress = block_bytes, progress

    def _bar(self, desc: str):
        if not self.progress:
            return None
        from recsync.metrics.progress import progress as bar_or_lines
        return bar_or_lines(sum(s.size_bytes for s in self.sources), "B", desc,
                            dynamic_ncols=True)

    def count(self) -> int:
        """Records of all inputs (pass 1)."""
        from recsync.data.convert_input import count_records
        bar, total = self._bar("convert: count"), 0
        try:
            for s in self.sources:
                total += count_records(s)
                if bar is not None:
                    bar.update(s.size_bytes)
        finally:
            if bar is not None:
                bar.close()
        self.total = total
        return total

    def fit(self, plan: Plan, split_at: int | None) -> dict:
        """Mean and std of the standardize features over the train rows (pass 2); sets them
        in ``plan`` and returns them by feature name."""
        stats = np.zeros((len(plan.dense), 3))

        def take(src, loc, p: Parsed) -> None:
            nonlocal stats
            stats = merge_stats(stats, p.stats)

        self._pass(replace(plan, fit=True), split_at, "convert: fit", take)
        fitted = {}
        for j, (name, _, how) in enumerate(plan.dense):
            if how != "standardize":
                continue
            n, mean, m2 = stats[j]
            std = float(np.sqrt(m2 / n)) if n else 0.0
            fitted[name] = {"mean": float(mean) if n else 0.0,
                            "std": std if std > 0 else 1.0, "count": int(n)}
        plan.set_fitted(fitted)
        return fitted

    def write(self, root: Path, plan: Plan, split_at: int | None, strict: bool,
              fitted: dict, allow_empty_train: bool = False) -> ConvertReport:
        """Parse and write every row (pass 3), then meta.json."""
        layout = layout_of(self.schema)
        writers = {k: SplitWriter(root, k, layout=layout, part_rows=PART_ROWS)
                   for k in ("train", "eval")}
        bad, truncated, examples = 0, 0, []

        def take(src: Source, loc, p: Parsed) -> None:
            nonlocal bad, truncated
            if strict:
                _stop_at_first(src, loc, p)
            bad += p.bad
            truncated += p.truncated
            for i, column, why in p.examples[:MAX_EXAMPLES - len(examples)]:
                examples.append(BadRow(place(src, loc, i), column, why))
            for split, mask in (("train", ~p.is_eval), ("eval", p.is_eval)):
                if mask.any():
                    _write_rows(writers[split], p, mask)

        records = self._pass(plan, split_at, "convert", take)
        if getattr(self, "total", records) != records:
            raise ConvertError(f"the inputs changed during the conversion: counted "
                               f"{self.total} records, then read {records}")
        infos = {k: w.close() for k, w in writers.items()}
        rows = infos["train"].rows + infos["eval"].rows
        names = ", ".join(s.name for s in self.sources)
        if rows == 0:
            if not examples:
                raise ConvertError(f"no data rows in {names}")
            e = examples[0]
            raise ConvertError(f"all {records:,} rows of {names} are bad; first: {e.where}: "
                               + (f"column {e.column}: " if e.column else "") + e.reason)
        if infos["train"].rows == 0 and not allow_empty_train:
            raise ConvertError(f"{names}: no train rows ({rows:,} eval rows, {bad:,} bad; "
                               f"{_split_rule(self.schema)}); pass --allow-empty-train for an "
                               f"eval-only data set (to score, not to train on)")
        preprocessing = {"schema": self.schema.model_dump(mode="json"), "hash": HASH_NAME,
                         "log1p": "float64",
                         "standardize": fitted}
        write_meta(root, layout=layout, splits=infos, preprocessing=preprocessing, source={
            "kind": "convert", "files": [s.name for s in self.sources], "lines": records,
            "bad_lines": bad, "bad_line_examples": [asdict(e) for e in examples],
            "truncated_lists": truncated})
        return ConvertReport(lines=records, rows_written=rows, bad_lines=bad, examples=examples,
                             truncated=truncated, train_rows=infos["train"].rows,
                             eval_rows=infos["eval"].rows, seconds=0.0,
                             preprocessing=preprocessing)

    def _pass(self, plan: Plan, split_at: int | None, desc: str, take) -> int:
        """Parse every piece of every input on the pool; ``take(source, loc, parsed)`` in input
        order on this thread. Returns the number of records."""
        bar, g = self._bar(desc), 0
        pending: deque = deque()

        def drain(limit: int) -> None:
            while len(pending) > limit:
                fut, src, loc, nbytes = pending.popleft()
                parsed = fut.result()
                if bar is not None:
                    bar.update(nbytes)
                take(src, loc, parsed)

        try:
            with ThreadPoolExecutor(_WORKERS) as pool:
                for src in self.sources:
                    for job, loc, records, nbytes in self._pieces(src, plan):
                        eval_from = split_at - g if split_at is not None else 2**62
                        pending.append((pool.submit(job, eval_from), src, loc, nbytes))
                        g += records
                        drain(2 * _WORKERS)
                drain(0)
        finally:
            if bar is not None:
                bar.close()
        return g

    def _pieces(self, src: Source, plan: Plan):
        return pieces(src, plan, self.schema.input.delimiter, self.block_bytes)


def pieces(src: Source, plan: Plan, delimiter: str, block_bytes: int = BLOCK_BYTES):
    """(job(eval_from) -> Parsed, location, records, bytes on disk) per piece of ``src``: a
    block of text lines (fast path, else pyarrow's CSV reader) or a batch of Parquet rows."""
    if src.kind == "parquet":
        check_types(src.name, parquet_types(src), plan)
        for batch, group, row0, nbytes in parquet_batches(src, plan.columns(), BATCH_ROWS):
            def job(eval_from, batch=batch):
                table = pa.Table.from_batches([batch])
                return parse(table, [], table.num_rows, plan, eval_from, src.eval)
            yield job, (group, row0), batch.num_rows, nbytes
        return
    for block in text_blocks(src, block_bytes):
        def job(eval_from, block=block):
            fast = fast_block(block.data, src.columns, plan, delimiter)
            if fast is not None:
                return parse(fast, fast.invalid, block.lines, plan, eval_from, src.eval)
            try:
                table, invalid = read_text_block(block.data, src.columns, plan, delimiter)
            except LineError as e:
                raise ConvertError(f"{src.name}:{block.line0 + e.index}: {e.why}") from None
            except pa.ArrowInvalid as e:
                raise ConvertError(f"{src.name}:{block.line0}-"
                                   f"{block.line0 + block.lines - 1}: cannot be parsed "
                                   f"({one_line(e)})") from None
            return parse(table, invalid, block.lines, plan, eval_from, src.eval)
        yield job, block.line0, block.lines, block.read_bytes


def _split_rule(schema: Schema) -> str:
    """The schema's split, for messages."""
    split = schema.split
    if split.column:
        return f"eval: split.column {split.column!r} in {split.values}"
    if split.eval_files:
        return f"eval: inputs matching split.eval_files {split.eval_files}"
    return f"eval: the last {split.fraction:g} of the records (split.eval_fraction)"


def place(src: Source, loc, i: int) -> str:
    """A record's place for messages: ``file:line`` (1-based), or a Parquet file's row group
    and 0-based row."""
    if src.kind == "parquet":
        group, row0 = loc
        return f"{src.name}: row group {group}, row {row0 + i}"
    return f"{src.name}:{loc + i}"


def _stop_at_first(src: Source, loc, p: Parsed) -> None:
    """Strict mode: raise at the piece's first bad row or truncated list."""
    stop_at_first(p, lambda i: place(src, loc, i), lists=True, note="--strict")


def stop_at_first(p: Parsed, where, *, lists: bool, note: str) -> None:
    """Raise ConvertError at the piece's first bad row (and, with ``lists``, truncated list):
    ``where(record index)`` names the place, ``note`` says why it is an error."""
    first = [(i, f"column {c}: {why}" if c else why) for i, c, why in p.examples[:1]]
    if lists and p.first_truncated is not None:
        i, column, n, max_len = p.first_truncated
        first.append((i, f"column {column}: a list of {n} elements, more than max_len "
                         f"{max_len}"))
    if first:
        i, why = min(first)
        raise ConvertError(f"{where(i)}: {why} ({note})")


def _write_rows(writer: SplitWriter, p: Parsed, mask: np.ndarray) -> None:
    if mask.all():
        writer.write(p.dense, p.sparse, p.label, weight=p.weight, multi=p.multi)
        return
    idx = np.flatnonzero(mask)
    writer.write(p.dense[idx], p.sparse[idx], p.label[idx],
                 weight=None if p.weight is None else p.weight[idx],
                 multi=[select_lists(v, o, idx) for v, o in p.multi])


def select_lists(values: np.ndarray, offsets: np.ndarray,
                 idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lists of rows ``idx`` (ascending) of a (values, offsets) ragged array."""
    lengths = offsets[idx + 1] - offsets[idx]
    new = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    positions = np.repeat(offsets[idx] - new[:-1], lengths) + np.arange(new[-1])
    return values[positions], new
