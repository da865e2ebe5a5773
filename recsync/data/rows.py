"""Raw rows (a pyarrow Table, a pandas DataFrame or a dict of columns) turned into a model's
inputs exactly as ``recsync data convert`` turned the training data into them: the schema and
the fitted statistics stored under ``preprocessing`` in the data set's meta.json are rebuilt
into the conversion's :class:`~recsync.data.convert_parse.Plan`, and the conversion's own
``parse`` runs on the rows. There is no second copy of the rules: a value hashes to the same
id, a dense value gets the same transform and a bad row is bad for the same reason.

In-memory columns are read as the conversion reads a Parquet file's: numbers may be numbers or
text, an integer category hashes as its decimal text, a list column feeds a multi-hot feature
directly; an empty text value is missing, as an empty CSV field is. The label (and the weight)
may be absent: rows to score have none (the batch's label is then NaN).

A data set the former Criteo converter wrote stored no schema: it is given the one it was made
with (recsync/data/criteo.py), so its rows go the same way. Synthetic data has no raw form: its
rows cannot be scored raw.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from recsync.data.convert import BLOCK_BYTES, HASH_NAME, BadRow, pieces, place, stop_at_first
from recsync.data.convert_input import ConvertError, check_names, head_bytes, open_source
from recsync.data.convert_parse import MAX_EXAMPLES, Parsed, Plan, check_types, parse
from recsync.data.reader import Batch
from recsync.data.schema import Schema


@dataclass
class RowsReport:
    """What happened to the rows: ``kept`` (int64, ascending) are the indices, in the input, of
    the batch's rows; the others were bad (skipped and counted, the first ten in ``examples``,
    as a conversion reports them); ``truncated``: multi-hot lists cut to max_len."""

    rows: int
    kept: np.ndarray
    bad: int
    examples: list[BadRow]
    truncated: int


def preprocess_table(table, data_meta: dict, *, source: str = "<rows>", strict: bool = True,
                     first_row: int = 0) -> Batch:
    """The model inputs of raw ``table`` (pyarrow Table, pandas DataFrame or dict of columns),
    preprocessed as the data set of ``data_meta`` (its meta.json, or a model's "data") was.

    ``strict``: a bad row raises ConvertError naming ``source`` and the row (0-based, counted
    from ``first_row``). Otherwise bad rows are skipped with a warning: use :func:`preprocess`
    to learn which input rows the batch holds."""
    batch, report = preprocess(table, data_meta, source=source, strict=strict,
                               first_row=first_row)
    if report.bad:
        e = report.examples[0]
        warnings.warn(f"{report.bad:,} of {report.rows:,} rows of {source} are bad and were "
                      f"skipped; first: {e.where}: "
                      + (f"column {e.column}: " if e.column else "") + e.reason, stacklevel=2)
    return batch


def preprocess(table, data_meta: dict, *, source: str = "<rows>", strict: bool = True,
               first_row: int = 0) -> tuple[Batch, RowsReport]:
    """:func:`preprocess_table` with its report (which input rows the batch holds)."""
    return RowPreprocessor(data_meta)(table, source=source, strict=strict, first_row=first_row)


def preprocess_files(paths, data_meta: dict, *, strict: bool = True,
                     columns: list[str] | None = None) -> Iterator[tuple[Batch, RowsReport]]:
    """Raw CSV/TSV/Parquet files streamed as (batch, report) pieces, read and preprocessed
    exactly as ``recsync data convert`` reads and preprocesses them
    (:meth:`RowPreprocessor.files`)."""
    return RowPreprocessor(data_meta).files(paths, strict=strict, columns=columns)


class RowPreprocessor:
    """The preprocessing of one data set, built once from its meta (for many batches)."""

    def __init__(self, data_meta: dict):
        prep = data_meta.get("preprocessing")
        if not prep and (data_meta.get("source") or {}).get("kind") == "criteo":
            from recsync.data.criteo import criteo_preprocessing
            prep = criteo_preprocessing(data_meta)
        if not prep:
            raise ValueError(
                f"raw rows cannot be scored for {_what(data_meta)}: it has no preprocessing "
                f"schema (meta.json 'preprocessing' is null); score rows of a data directory "
                f"instead, or convert raw data with `recsync data convert` and train on that")
        if prep.get("hash") != HASH_NAME:
            raise ValueError(f"meta.json preprocessing.hash: {prep.get('hash')!r}; this recsync "
                             f"hashes categories with {HASH_NAME!r}")
        try:
            self.schema = Schema.model_validate(prep["schema"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"meta.json preprocessing.schema: not a valid schema "
                             f"({str(e).splitlines()[0]})") from None
        self.plan = Plan.of(self.schema)
        self.plan.split_column, self.plan.split_values = "", []  # no split: rows are rows
        self.plan.log1p_float64 = prep.get("log1p") == "float64"  # else as converted before
        try:
            self.plan.set_fitted(prep.get("standardize") or {})
        except (KeyError, TypeError) as e:
            why = (f"no statistics for the standardize feature {e.args[0]!r}"
                   if isinstance(e, KeyError) else "statistics of the wrong type")
            raise ValueError(f"meta.json preprocessing.standardize: {why}") from None

    def __call__(self, table, *, source: str = "<rows>", strict: bool = True,
                 first_row: int = 0) -> tuple[Batch, RowsReport]:
        names = column_names(table)
        plan = self.plan_for(source, names, "columns")
        arrow = to_arrow(table, plan.columns(), source)
        check_types(source, {c: arrow.column(c).type for c in arrow.column_names}, plan)
        p = parse(arrow, [], arrow.num_rows, plan, 2**62, False)
        where = lambda i: f"{source}: row {first_row + i}"  # noqa: E731
        if strict:
            stop_at_first(p, where, lists=False, note="strict")
        return to_batch(p), report(p, where)

    def plan_for(self, source: str, names: list[str], listed_in: str) -> Plan:
        """The plan for rows with columns ``names`` (the label and weight may be absent);
        ConvertError naming ``source`` if a feature's column is missing."""
        keys = {c: k for c, k in self.schema.column_keys().items()
                if c != self.schema.split.column or k != "split.column"}
        plan = self.plan
        absent = {c for c in (plan.label, plan.weight) if c and c not in names}
        if absent:  # rows to score: no label (and no weight) needed
            plan = replace(plan, label="" if plan.label in absent else plan.label,
                           weight="" if plan.weight in absent else plan.weight)
            keys = {c: k for c, k in keys.items() if c not in absent}
        check_names(source, names, keys, listed_in)
        return plan

    def files(self, paths, *, strict: bool = True, columns: list[str] | None = None,
              block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[Batch, RowsReport]]:
        """(batch, report) per piece (a block of text lines, a batch of Parquet rows) of each
        of ``paths``, read exactly as ``recsync data convert`` reads them (the schema's
        delimiter and header; plain or compressed text, or Parquet); a report's ``kept`` are
        0-based record indices in its file, and bad rows are named ``file:line``.
        ``columns``: the column names of headerless text instead of the schema's; without
        it, headerless text whose first line has one field fewer than the schema's columns is
        read without the label column (rows to score: a Criteo test file)."""
        schema = self.schema
        if columns is not None:
            schema = schema.model_copy(update={"input": schema.input.model_copy(
                update={"columns": list(columns)})})
        for path in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
            src = open_source(str(path), schema)
            if columns is None and src.kind == "text" and not schema.input.header:
                src.columns = without_absent_label(src, schema.input.delimiter, src.columns,
                                                   self.plan.label)
            listed_in = "header" if src.kind == "text" and schema.input.header else "columns"
            plan = self.plan_for(src.name, src.columns, listed_in)
            first = 0
            for job, loc, records, _ in pieces(src, plan, schema.input.delimiter, block_bytes):
                p = job(2**62)
                where = functools.partial(place, src, loc)
                if strict:
                    stop_at_first(p, where, lists=False, note="strict")
                r = report(p, where)
                r.kept = r.kept + first
                first += records
                yield to_batch(p), r


def without_absent_label(src, delimiter: str, columns: list[str], label: str) -> list[str]:
    """``columns`` less the label's when the first line has one field fewer than them."""
    first = head_bytes(src, 1 << 20).split(b"\n", 1)[0].rstrip(b"\r")
    if label in columns and first.count(delimiter.encode()) + 1 == len(columns) - 1:
        return [c for c in columns if c != label]
    return columns


def report(p: Parsed, where) -> RowsReport:
    """A parsed piece's :class:`RowsReport`; ``where(record index)`` names a row."""
    return RowsReport(rows=p.records, kept=p.kept, bad=p.bad, truncated=p.truncated,
                      examples=[BadRow(where(i), c, why) for i, c, why in
                                p.examples[:MAX_EXAMPLES]])


def to_batch(p: Parsed) -> Batch:
    """A parsed piece as the reader's Batch (ids widened to int64, as the reader does)."""
    return Batch(dense=torch.from_numpy(p.dense),
                 sparse=torch.from_numpy(p.sparse.astype(np.int64)),
                 label=torch.from_numpy(p.label),
                 weight=None if p.weight is None else torch.from_numpy(p.weight),
                 multi=tuple((torch.from_numpy(v.astype(np.int64, copy=False)),
                              torch.from_numpy(o)) for v, o in p.multi))


def _what(meta: dict) -> str:
    kind = (meta.get("source") or {}).get("kind")
    if meta.get("synthetic") is not None or kind == "synthetic":
        return "synthetic data (`recsync data synth`)"
    return "this data set"


def column_names(table) -> list[str]:
    if isinstance(table, pa.Table):
        return list(table.column_names)
    if isinstance(table, dict):
        return [str(k) for k in table]
    if hasattr(table, "columns") and hasattr(table, "iloc"):  # pandas
        return [str(c) for c in table.columns]
    raise TypeError(f"raw rows must be a pyarrow Table, a pandas DataFrame or a dict of "
                    f"columns, not {type(table).__name__}")


def to_arrow(table, columns: list[str], source: str) -> pa.Table:
    """The ``columns`` of ``table`` as a pyarrow Table, as the conversion reads them: one chunk
    per column, dictionaries decoded, empty text null (an empty field is a missing value)."""
    try:
        if isinstance(table, pa.Table):
            t = table.select(columns)
        elif isinstance(table, dict):
            t = pa.table({c: table[c] for c in columns})
        else:
            t = pa.Table.from_pandas(table[columns], preserve_index=False)
    except (pa.ArrowException, ValueError, TypeError) as e:
        raise ConvertError(f"{source}: the columns cannot be read as Arrow arrays "
                           f"({str(e).splitlines()[0]})") from None
    return pa.table({c: _normalized(t.column(c)) for c in columns})


def _normalized(col) -> pa.Array:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if pa.types.is_null(t):  # a column with no value at all
        return pa.array([None] * len(col), type=pa.string())
    if (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t)):
        empty = pc.equal(pc.binary_length(col), 0)
        if pc.any(empty).as_py():
            col = pc.if_else(empty, pa.scalar(None, t), col)
    return col
