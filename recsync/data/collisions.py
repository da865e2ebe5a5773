"""How many distinct values of each table share a row id: the collisions of fixed-size hashing,
next to those of a dynamic table (issue 33), counted on raw input files.

    collisions = distinct values - distinct ids          (per table, missing values left out)

The files are read and parsed as ``recsync data convert`` reads them (convert.py ``pieces``: the
same reader, fast path, bad rows and multi-hot cut to max_len), twice: once with every table
fixed (``1 + hash % (rows - 1)``, rows from the schema) and once with every table dynamic (the
full 64-bit hash), and the ids counted are the ones those conversions write. The values counted
are the ones those ids are made of: a categorical field, or a multi-hot element kept after the
cut. A value is what the hash reads: its bytes, or for an ``encoding = "hex32"`` feature a value
of 8 hex digits as its integer (``68FD1E64`` and ``68fd1e64`` are one value). Features sharing a
table share its values. The label and weight are not needed: a file without them (a Criteo test
file) is counted too.

    PYTHONPATH=. python -c "from recsync.data.collisions import count_collisions; \\
        from recsync.data.schema import load_preset; \\
        print(count_collisions(['day_0.txt'], load_preset('criteo')))"
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recsync.data.convert import BLOCK_BYTES, pieces
from recsync.data.convert_input import check_names, open_source
from recsync.data.convert_parse import Parsed, Plan, list_elements
from recsync.data.rows import without_absent_label
from recsync.data.schema import Schema
from recsync.data.value_hash import hex32_values, valid_mask


@dataclass(frozen=True)
class TableCollisions:
    """One table's counts over the files."""

    table: str
    rows: int  # the schema's rows for it: a fixed table's ids are 1..rows-1
    values: int  # distinct values (missing ones left out)
    fixed_ids: int  # distinct ids a fixed table of ``rows`` gives them
    dynamic_ids: int  # distinct ids a dynamic table gives them

    @property
    def fixed_collisions(self) -> int:
        return self.values - self.fixed_ids

    @property
    def dynamic_collisions(self) -> int:
        return self.values - self.dynamic_ids


def count_collisions(paths, schema: Schema, *,
                     block_bytes: int = BLOCK_BYTES) -> list[TableCollisions]:
    """Per table of ``schema`` (in schema order), its distinct values in ``paths`` and the
    distinct ids fixed and dynamic tables give them. Raises ConvertError (one line naming the
    file) as a conversion would: a missing or unreadable input, a column the schema reads
    missing from it."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ValueError("no input files given")
    tables = schema.table_names()
    values = {t: _Keys() for t in tables}
    ids: dict[str, dict[str, _Distinct]] = {}
    for kind in ("fixed", "dynamic"):
        s = schema.with_table_kind(kind)
        ids[kind] = {t: _Distinct() for t in tables}
        for p in _parsed(paths, s, block_bytes, raw=kind == "fixed"):
            for table, got in _ids_by_table(s, p):
                ids[kind][table].add(got[got != 0])
            if p.raw is not None:
                _add_values(s, p, values)
    return [TableCollisions(t, schema.table_rows(t), values[t].count(),
                            ids["fixed"][t].count(), ids["dynamic"][t].count())
            for t in tables]


def _parsed(paths: list, schema: Schema, block_bytes: int, raw: bool):
    """Every piece of every input parsed as a conversion parses it, without the split, and
    without the label and weight where an input lacks them."""
    base = replace(Plan.of(schema), split_column="", split_values=[], raw=raw)
    keys = {c: k for c, k in schema.column_keys().items() if k != "split.column"}
    for path in paths:
        src = open_source(str(path), schema)
        if src.kind == "text" and not schema.input.header:
            src.columns = without_absent_label(src, schema.input.delimiter, src.columns,
                                               base.label)
        absent = {c for c in (base.label, base.weight) if c and c not in src.columns}
        plan = replace(base, label="" if base.label in absent else base.label,
                       weight="" if base.weight in absent else base.weight)
        listed_in = "header" if src.kind == "text" and schema.input.header else "columns"
        check_names(src.name, src.columns, {c: k for c, k in keys.items() if c not in absent},
                    listed_in)
        for job, _, _, _ in pieces(src, plan, schema.input.delimiter, block_bytes):
            yield job(2**62)


def _ids_by_table(schema: Schema, p: Parsed):
    """(table, ids) of each sparse feature of a parsed piece."""
    for j, f in enumerate(schema.categorical):
        yield f.table or f.name, np.asarray(p.sparse[:, j], dtype=np.int64)
    for j, f in enumerate(schema.multi_hot):
        yield f.table or f.name, p.multi[j][0]


def _add_values(schema: Schema, p: Parsed, values: dict[str, _Keys]) -> None:
    """The values of a parsed piece's sparse features, each into its table's keys."""
    for f in schema.categorical:
        col = p.raw[f.column or f.name]
        keys = values[f.table or f.name]
        if f.encoding == "hex32":
            ok, v = hex32_values(col)
            keys.ints.add(v[ok])
            col = col.filter(pa.array(~ok))
        keys.add_text(col)
    for f in schema.multi_hot:
        flat, _, keep, _, _ = list_elements(p.raw[f.column or f.name], f.separator, f.max_len)
        values[f.table or f.name].add_text(flat.filter(pa.array(keep)))


class _Distinct:
    """Distinct values seen so far (numpy arrays or Arrow arrays of one type), merged every
    ``_MERGE_EVERY`` pieces so memory follows the distinct values, not the pieces."""

    def __init__(self):
        self.pieces: list = []

    def add(self, values) -> None:
        self.pieces.append(_unique(values))
        if len(self.pieces) >= _MERGE_EVERY:
            self.pieces = [self._merged()]

    def _merged(self):
        if isinstance(self.pieces[0], np.ndarray):
            return _unique(np.concatenate(self.pieces))
        return _unique(pa.concat_arrays(self.pieces))

    def count(self) -> int:
        return len(self._merged()) if self.pieces else 0


_MERGE_EVERY = 64


def _unique(values):
    return np.unique(values) if isinstance(values, np.ndarray) else pc.unique(values)


class _Keys:
    """A table's distinct values so far: integers (hex32 values) and text (their bytes)."""

    def __init__(self):
        self.ints = _Distinct()
        self.text = _Distinct()

    def add_text(self, col: pa.Array) -> None:
        """The present, non-empty values of ``col`` (text, or numbers: as their decimal text,
        as the hash reads them)."""
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if not any(f(col.type) for f in (pa.types.is_string, pa.types.is_binary,
                                          pa.types.is_large_string, pa.types.is_large_binary)):
            col = pc.cast(col, pa.string())
        col = pc.cast(col, pa.large_binary())
        present = valid_mask(col)
        present &= np.asarray(pc.binary_length(col).fill_null(0)) > 0
        self.text.add(col.filter(pa.array(present)))

    def count(self) -> int:
        return self.ints.count() + self.text.count()
