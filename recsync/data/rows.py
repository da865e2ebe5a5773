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

Data converted by ``recsync data criteo`` has no schema; its raw rows (columns ``label``
(optional), ``I1``..``I13``, ``C1``..``C26``) go through that converter's block parser
(recsync/data/criteo_rows.py). Synthetic data has no raw form: its rows cannot be scored raw.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from recsync.data.convert import HASH_NAME, BadRow, stop_at_first
from recsync.data.convert_input import ConvertError, check_names
from recsync.data.convert_parse import MAX_EXAMPLES, Parsed, Plan, parse
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


class RowPreprocessor:
    """The preprocessing of one data set, built once from its meta (for many batches)."""

    def __init__(self, data_meta: dict):
        prep = data_meta.get("preprocessing")
        if not prep:
            if (data_meta.get("source") or {}).get("kind") == "criteo":
                from recsync.data.criteo_rows import CriteoRows
                self._criteo = CriteoRows(data_meta)
                return
            raise ValueError(
                f"raw rows cannot be scored for {_what(data_meta)}: it has no preprocessing "
                f"schema (meta.json 'preprocessing' is null); score rows of a data directory "
                f"instead, or convert raw data with `recsync data convert` and train on that")
        self._criteo = None
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
        try:
            self.plan.set_fitted(prep.get("standardize") or {})
        except KeyError as e:
            raise ValueError(f"meta.json preprocessing.standardize: no statistics for the "
                             f"standardize feature {e.args[0]!r}") from None

    def __call__(self, table, *, source: str = "<rows>", strict: bool = True,
                 first_row: int = 0) -> tuple[Batch, RowsReport]:
        if self._criteo is not None:
            return self._criteo(table, source=source, strict=strict, first_row=first_row)
        keys = {c: k for c, k in self.schema.column_keys().items()
                if c != self.schema.split.column or k != "split.column"}
        names = column_names(table)
        plan = self.plan
        optional = [c for c in (plan.label, plan.weight) if c]
        absent = {c for c in optional if c not in names}
        if absent:  # rows to score: no label (and no weight) needed
            plan = replace(plan, label="" if plan.label in absent else plan.label,
                           weight="" if plan.weight in absent else plan.weight)
            keys = {c: k for c, k in keys.items() if c not in absent}
        check_names(source, names, keys, "columns")
        arrow = to_arrow(table, plan.columns(), source)
        p = parse(arrow, [], arrow.num_rows, plan, 2**62, False)
        where = lambda i: f"{source}: row {first_row + i}"  # noqa: E731
        if strict:
            stop_at_first(p, where, lists=False, note="strict")
        return to_batch(p), report(p, where)


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
