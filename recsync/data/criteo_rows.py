"""Raw Criteo rows for a data set converted by ``recsync data criteo`` (which stores no schema):
the columns ``label`` (optional: rows to score have none), ``I1``..``I13`` and ``C1``..``C26``
are joined back into tab-separated lines and parsed by that converter's block parser
(recsync/data/criteo_block_parser.py), so a row gets exactly the ids and dense values the
conversion gave it, and a bad row is bad for the same reason."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from recsync.data.convert import BadRow
from recsync.data.convert_input import ConvertError, check_names
from recsync.data.criteo_block_parser import PAD, mod_groups, parse_block
from recsync.data.criteo_rules import DENSE_NAMES, TABLE_NAMES
from recsync.data.format import Layout, criteo_layout
from recsync.data.reader import Batch

FEATURES = [*DENSE_NAMES, *TABLE_NAMES]


class CriteoRows:
    """The preprocessing of one ``recsync data criteo`` data set (its table sizes)."""

    def __init__(self, data_meta: dict):
        layout = Layout.from_meta(data_meta)
        rows = [t.rows for t in layout.tables]
        if layout != criteo_layout(rows):
            raise ValueError("meta.json: a 'criteo' data set without the Criteo layout (I1..I13, "
                             "C1..C26); its raw rows cannot be scored")
        self.mods = mod_groups(rows)

    def __call__(self, table, *, source: str, strict: bool, first_row: int):
        from recsync.data.rows import RowsReport, column_names, to_arrow
        names = column_names(table)
        check_names(source, names, {c: "the Criteo layout" for c in FEATURES}, "columns")
        has_label = "label" in names
        cols = ["label", *FEATURES] if has_label else FEATURES
        arrow = to_arrow(table, cols, source)
        n = arrow.num_rows
        fields = [pc.cast(arrow.column(c).combine_chunks(), pa.string()).fill_null("")
                  for c in cols]
        for c, f in zip(cols, fields):  # a tab or line end would move the fields
            odd = np.asarray(pc.match_substring_regex(f, "[\t\r\n]"))
            if odd.any():
                raise ConvertError(f"{source}: row {first_row + int(np.argmax(odd))}: column "
                                   f"{c}: a tab or line end in a value")
        if not has_label:
            fields.insert(0, pa.array(["0"] * n, pa.string()))
        lines = pc.binary_join_element_wise(*fields, "\t")
        text = pc.binary_join_element_wise(lines, pa.array([""] * n, pa.string()), "\n")
        offsets = np.frombuffer(text.buffers()[1], np.int32)[text.offset:text.offset + n + 1]
        data = np.frombuffer(text.buffers()[2], np.uint8)[offsets[0]:offsets[-1]] \
            if n else np.zeros(0, np.uint8)
        buf = bytearray(len(data) + PAD)
        buf[:len(data)] = data.tobytes()
        blk = parse_block(buf, len(data), False, self.mods)
        where = lambda i: f"{source}: row {first_row + i}"  # noqa: E731
        if strict and len(blk.bad_idx):
            raise ConvertError(f"{where(int(blk.bad_idx[0]))}: {blk.reasons[0]} (strict)")
        label = blk.label if has_label else np.full(len(blk.ok_idx), np.nan, np.float32)
        batch = Batch(dense=torch.from_numpy(np.ascontiguousarray(blk.dense, np.float32)),
                      sparse=torch.from_numpy(blk.sparse.astype(np.int64)),
                      label=torch.from_numpy(np.ascontiguousarray(label, np.float32)))
        return batch, RowsReport(
            rows=n, kept=np.asarray(blk.ok_idx, np.int64), bad=len(blk.bad_idx), truncated=0,
            examples=[BadRow(where(int(i)), "", r) for i, r in zip(blk.bad_idx, blk.reasons)])
