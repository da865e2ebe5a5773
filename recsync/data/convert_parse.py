"""One piece of input (a block of text lines or a Parquet batch) turned into model inputs:
the label, the dense features after their transform, hashed ids, multi-hot lists, the rows that
are eval, and the bad rows with their reasons. Pure functions of the piece and a :class:`Plan`,
run on a small thread pool (pyarrow and numpy release the GIL).

A row is bad (skipped and counted) when its field count differs from the header's, its label is
missing, not a number or (without a threshold) not 0 or 1, its weight is missing or not a finite
number >= 0, or a dense value is present but not a finite number. A number may have spaces or
tabs around it (as pyarrow's CSV reader takes it), whichever path reads it. Categorical values
are never bad: any text hashes. A multi-hot list longer than max_len is truncated, not bad.
(Text blocks are read into tables by convert_fast.py or convert_csv.py.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recsync.data.convert_fast import NUMBER, FastBlock
from recsync.data.convert_input import ConvertError
from recsync.data.format import MAX_INT32_ROWS
from recsync.data.schema import Schema
from recsync.data.value_hash import hash_text, ids_of, to_ids, valid_mask
from recsync.safe_names import printable

MAX_EXAMPLES = 10  # bad rows reported per conversion
_EDGE_BLANKS = r"^[ \t]+|[ \t]+$"  # around a number: the CSV reader skips them, so does parse()


@dataclass
class Plan:
    """What a conversion reads and computes, from the schema (and the fitted statistics)."""

    label: str  # "" when the rows have no label (raw rows to score: recsync/data/rows.py)
    threshold: float | None
    weight: str
    dense: list[tuple[str, str, str]]  # (name, column, transform)
    # table rows: None for a dynamic table (ids are the full hash: value_hash.dynamic_ids)
    cats: list[tuple[str, str, int | None, str]]  # (name, column, table rows, encoding)
    multi: list[tuple[str, str, int | None, str, int]]  # (name, column, rows, separator, max_len)
    split_column: str
    split_values: list[str]
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per dense feature
    std: np.ndarray = field(default_factory=lambda: np.zeros(0))
    fit: bool = False  # the statistics pass: label, weight and dense only
    log1p_float64: bool = True  # False: as data sets converted before log1p was float64
    raw: bool = False  # also hand back the kept rows' sparse columns (data/collisions.py)

    @classmethod
    def of(cls, schema: Schema) -> Plan:
        col = lambda f: f.column or f.name  # noqa: E731
        def rows(f) -> int | None:
            t = f.table or f.name
            return None if schema.table_kind(t) == "dynamic" else schema.table_rows(t)
        plan = cls(label=schema.label.column, threshold=schema.label.threshold,
                   weight=schema.weight,
                   dense=[(f.name, col(f), f.transform) for f in schema.dense],
                   cats=[(f.name, col(f), rows(f), f.encoding) for f in schema.categorical],
                   multi=[(f.name, col(f), rows(f), f.separator, f.max_len)
                          for f in schema.multi_hot],
                   split_column=schema.split.column,
                   split_values=[str(v) for v in schema.split.values])
        plan.mean, plan.std = np.zeros(len(plan.dense)), np.ones(len(plan.dense))
        return plan

    def set_fitted(self, fitted: dict) -> None:
        """Use the fitted statistics (``{name: {"mean", "std"}}`` of the standardize features,
        as meta.json's ``preprocessing.standardize`` stores them)."""
        for j, (name, _, how) in enumerate(self.dense):
            if how == "standardize":
                self.mean[j], self.std[j] = fitted[name]["mean"], fitted[name]["std"]

    @property
    def id_dtype(self) -> type:
        """Single-hot ids: int32 where every table fits (as the data set stores them)."""
        fits = all(c[2] is not None and c[2] <= MAX_INT32_ROWS for c in self.cats)
        return np.int32 if fits else np.int64

    def numeric_columns(self) -> set[str]:
        """Columns read only as numbers (not also hashed or split on)."""
        text = {c[1] for c in self.cats} | {m[1] for m in self.multi} | {self.split_column}
        return {c for c in (self.label, self.weight, *(d[1] for d in self.dense))
                if c and c not in text}

    def columns(self) -> list[str]:
        cols = [self.label, self.weight, *(d[1] for d in self.dense), self.split_column]
        if not self.fit:
            cols += [c[1] for c in self.cats] + [m[1] for m in self.multi]
        return list(dict.fromkeys(c for c in cols if c))


@dataclass
class Parsed:
    records: int  # lines or rows of the piece, bad ones included
    bad: int
    examples: list[tuple[int, str, str]]  # (record index in the piece, column or "", reason)
    truncated: int = 0  # multi-hot lists cut to max_len
    first_truncated: tuple[int, str, int, int] | None = None  # (record, column, len, max_len)
    is_eval: np.ndarray | None = None  # bool per row written
    kept: np.ndarray | None = None  # int64 per row written: its record index in the piece
    dense: np.ndarray | None = None
    sparse: np.ndarray | None = None
    label: np.ndarray | None = None
    weight: np.ndarray | None = None
    multi: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    stats: np.ndarray | None = None  # fit: [num dense, 3] (count, mean, M2) of train rows
    raw: dict | None = None  # plan.raw: column -> Arrow array of the rows written


def check_types(source: str, types: dict, plan: Plan) -> None:
    """Every column the plan reads has a type it can read (``types``: column -> Arrow type);
    ConvertError naming ``source``, the column and its type otherwise."""
    need = [(c, "number") for c in (plan.label, plan.weight, *(d[1] for d in plan.dense)) if c]
    need += [(c[1], "text") for c in plan.cats] + [(m[1], "list") for m in plan.multi]
    need += [(plan.split_column, "text")] if plan.split_column else []
    for column, role in need:
        t = types.get(column)
        if t is not None and not _readable(t, role):
            raise ConvertError(f"{source}: column {column!r} has type {t}, which recsync cannot "
                               f"read; {_ROLES[role]}")


_ROLES = {"number": "a label, weight or dense column holds numbers (or their text)",
          "text": "a categorical or split column holds text or numbers (or dates or times, "
                  "read as their text)",
          "list": "a multi-hot column holds text (split at its separator) or a list of text or "
                  "numbers"}


def _readable(t: pa.DataType, role: str) -> bool:
    """Whether parse() reads a column of type ``t`` in ``role``: the casts it makes exist."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if role == "list" and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        t, role = t.value_type, "text"
    elif role == "list":
        return pa.types.is_null(t) or any(f(t) for f in (
            pa.types.is_string, pa.types.is_binary, pa.types.is_large_string,
            pa.types.is_large_binary))
    try:
        pc.cast(pa.nulls(1, t), pa.float64() if role == "number" else pa.string())
        return True
    except pa.ArrowNotImplementedError:
        return False


def _numbers(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, 0 where missing or bad; present; bad = present but not a finite
    number)."""
    present = valid_mask(col)
    if pa.types.is_floating(col.type) or pa.types.is_integer(col.type) or \
            pa.types.is_boolean(col.type):
        x = col
    else:
        try:
            x = pc.cast(col, pa.float64())
        except pa.ArrowInvalid:  # some value is not a number: null those, they are bad
            text = pc.replace_substring_regex(pc.cast(col, pa.binary()), _EDGE_BLANKS, "")
            ok = pc.match_substring_regex(text, NUMBER)  # (the CSV reader trims as the cast)
            x = pc.cast(pc.if_else(ok, text, pa.scalar(None, pa.binary())), pa.float64())
    if x.type != pa.float64():
        x = pc.cast(x, pa.float64())
    values = x.to_numpy(zero_copy_only=False)
    if not values.flags.writeable:
        values = values.copy()
    finite = np.isfinite(values)
    if not finite.all():
        values[~finite] = 0.0
    return values, present, present & ~finite


def _text(col: pa.Array, i: int) -> str:
    """Value i for a message: a number as such (the same whether the CSV reader parsed it or
    not), anything else quoted."""
    v = col[i].as_py()
    if isinstance(v, bytes):  # bytes that are not UTF-8 shown as \xff, control characters escaped
        v = v.decode("utf-8", "backslashreplace")
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return f"'{printable(v, 38)}'" if isinstance(v, str) else printable(v, 40)


def _combine(col) -> pa.Array:
    """One array, a dictionary's values decoded, a column of only nulls as text."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return pa.nulls(len(col), pa.string()) if pa.types.is_null(col.type) else col


def parse(table: pa.Table, invalid: list[tuple[int, str]], records: int, plan: Plan,
          eval_from: int, eval_file: bool) -> Parsed:
    """The rows of ``table`` (the piece's records less ``invalid`` ones) as model inputs.
    Records with index >= ``eval_from`` are eval (the eval_fraction split), all if
    ``eval_file``, and those whose split column holds a split value."""
    n = table.num_rows
    rec = np.arange(records, dtype=np.int64)
    if invalid:
        rec = np.delete(rec, [i for i, _ in invalid])
    assert len(rec) == n, (len(rec), n)
    fast = isinstance(table, FastBlock)  # numbers and ids already computed
    if fast:
        cols, num = table.cols, table.numbers
    else:
        cols = {c: _combine(table.column(c)) for c in plan.columns()}
        num = lambda c: _numbers(cols[c])  # noqa: E731
    checks: list[tuple[str, np.ndarray, str]] = []  # (column, bad mask, why)
    if not plan.label:  # rows to score: no label (NaN)
        label = np.full(n, np.nan, dtype=np.float32)
    else:
        y, present, nonnum = num(plan.label)
        checks.append((plan.label, ~present, "the label is missing"))
        checks.append((plan.label, nonnum, "the label is not a number"))
        if plan.threshold is None:
            checks.append((plan.label, present & ~nonnum & (y != 0) & (y != 1),
                           "the label is not 0 or 1"))
            label = y.astype(np.float32)
        else:
            label = (y >= plan.threshold).astype(np.float32)
    weight = None
    if plan.weight:
        w, wp, wbad = num(plan.weight)
        checks.append((plan.weight, ~wp | wbad | (w < 0), "the weight is not a number >= 0"))
        weight = w.astype(np.float32)
    raw = np.zeros((len(plan.dense), n), dtype=np.float64)  # feature-major: rows contiguous
    dense_present = np.zeros((len(plan.dense), n), dtype=bool)
    for j, (_, column, _) in enumerate(plan.dense):
        raw[j], dense_present[j], bad_j = num(column)
        checks.append((column, bad_j, "is not a number"))
    bad = np.zeros(n, dtype=bool)
    for _, mask, _ in checks:
        bad |= mask
    examples = [(i, "", why) for i, why in invalid[:MAX_EXAMPLES]]
    for i in np.flatnonzero(bad)[:MAX_EXAMPLES].tolist():
        column, _, why = next(c for c in checks if c[1][i])
        value = "" if why.startswith("the label is missing") else _text(cols[column], i)
        if why == "is not a number":
            why = f"{value} is not a number"
        elif why != "the label is missing":
            why = f"{why} ({value})"
        examples.append((int(rec[i]), column, why))
    examples = sorted(examples)[:MAX_EXAMPLES]
    out = Parsed(records=records, bad=int(bad.sum()) + len(invalid), examples=examples)

    keep = ~bad
    if not keep.all():
        rec, label = rec[keep], label[keep]
        raw, dense_present = raw[:, keep], dense_present[:, keep]
        weight = weight[keep] if weight is not None else None
        if fast:
            table = table.filter(keep)
            cols = table.cols
        else:
            cols = {c: v.filter(pa.array(keep)) for c, v in cols.items()}
    is_eval = np.full(len(rec), eval_file) | (rec >= eval_from)
    if plan.split_column:
        col = cols[plan.split_column]
        if not (pa.types.is_binary(col.type) or pa.types.is_string(col.type)):
            col = pc.cast(col, pa.string())
        values = pa.array([v.encode() if pa.types.is_binary(col.type) else v
                           for v in plan.split_values], type=col.type)
        is_eval |= np.asarray(pc.is_in(col, value_set=values).fill_null(False))
    if plan.fit:
        out.stats = _stats(raw, dense_present & ~is_eval)
        return out
    out.is_eval, out.label, out.weight, out.kept = is_eval, label, weight, rec
    out.dense = _transform(raw, dense_present, plan)
    if plan.raw:
        out.raw = {c[1]: cols[c[1]] for c in (*plan.cats, *plan.multi)}
    if fast:
        out.sparse = table.sparse
    else:
        out.sparse = np.empty((len(rec), len(plan.cats)), dtype=plan.id_dtype)
        for j, (_, column, rows, encoding) in enumerate(plan.cats):
            out.sparse[:, j] = ids_of(cols[column], rows, encoding)
    for _, column, rows, sep, max_len in plan.multi:
        values, offsets, counts = _multi_hot(cols[column], rows, sep, max_len)
        out.multi.append((values, offsets))
        cut = counts > max_len
        if cut.any():
            out.truncated += int(cut.sum())
            i = int(np.argmax(cut))
            first = (int(rec[i]), column, int(counts[i]), max_len)
            out.first_truncated = min(out.first_truncated or first, first)
    return out


def _transform(raw: np.ndarray, present: np.ndarray, plan: Plan) -> np.ndarray:
    """float32 [n, features] from raw [features, n] (missing values are 0 in raw)."""
    dense = np.empty(raw.shape[::-1], dtype=np.float32)
    for j, (_, _, how) in enumerate(plan.dense):
        x = raw[j]
        if how == "log1p" and plan.log1p_float64:  # rounded once, to the float32 stored
            np.maximum(x, 0.0, out=x)
            np.log1p(x, out=x)
        elif how == "log1p":  # a data set whose meta.json lacks preprocessing.log1p: as it was
            y = np.maximum(x, 0.0).astype(np.float32)
            np.log1p(y, out=y)
            x = y
        elif how == "standardize":
            x -= plan.mean[j]
            x /= plan.std[j]
            x[~present[j]] = 0.0
        dense[:, j] = x
    return dense


def _stats(raw: np.ndarray, use: np.ndarray) -> np.ndarray:
    """[features, 3]: count, mean and sum of squared deviations of the values used."""
    out = np.zeros((raw.shape[0], 3))
    for j in range(raw.shape[0]):
        x = raw[j, use[j]]
        if len(x):
            out[j] = (len(x), x.mean(), ((x - x.mean()) ** 2).sum())
    return out


def merge_stats(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Chan et al.'s pairwise combination of (count, mean, M2) rows."""
    n = a[:, 0] + b[:, 0]
    safe = np.where(n > 0, n, 1)
    delta = b[:, 1] - a[:, 1]
    mean = a[:, 1] + delta * b[:, 0] / safe
    m2 = a[:, 2] + b[:, 2] + delta ** 2 * a[:, 0] * b[:, 0] / safe
    return np.stack([n, mean, m2], axis=1)


def _multi_hot(col: pa.Array, rows: int | None, sep: str, max_len: int):
    """(int64 ids [nnz], int64 offsets [n + 1], elements per row before the cut to max_len)
    of a list column (a list type, or text split at ``sep``); empty elements are dropped."""
    flat, h, keep, offsets, counts = list_elements(col, sep, max_len)
    return to_ids(h[keep], rows), offsets, counts


def list_elements(col: pa.Array, sep: str, max_len: int):
    """(every element, its hash, bool: kept (present and among its row's first max_len),
    int64 offsets [n + 1] of the kept ones, elements per row before the cut) of a list column
    (a list type, or text split at ``sep``): what a multi-hot feature's ids are made of."""
    lists = col if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) \
        else pc.split_pattern(col, sep)
    lengths = np.asarray(pc.list_value_length(lists).fill_null(0), dtype=np.int64)
    flat = lists.flatten()  # the elements of the non-null lists, in order
    h, present = hash_text(flat) if len(flat) else (np.zeros(0, np.uint64), np.zeros(0, bool))
    ends = np.cumsum(lengths)
    before = np.concatenate([[0], np.cumsum(present)])  # present elements before index i
    counts = before[ends] - before[ends - lengths]
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    rank = before[:-1] - (before[ends - lengths])[row_of]  # rank among its row's present ones
    keep = present & (rank < max_len)
    kept = np.minimum(counts, max_len)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    return flat, h, keep, offsets, counts
