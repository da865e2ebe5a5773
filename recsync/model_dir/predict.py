"""`recsync predict`: score every row of an input with a model directory, streamed in batches,
one ``score`` per row in input order (and ``label`` where the input has labels), written as
Parquet or CSV (by the output's suffix). The output appears under its name only once complete;
it replaces an existing file only with ``overwrite`` and never one of the inputs (outfile.py).
The data set must be the model's kind of data, hashed into its training data's table sizes
(``check_layout``).

Inputs: a converted data set's split (rows in the split's order), or raw CSV/TSV/Parquet files
(plain or compressed) read and preprocessed exactly as ``recsync data convert`` read the
training data (recsync.data.rows). A bad raw row is skipped and counted like the conversion's
(its score is null, so the output stays row for row with the input) and the first ones are
named file:line; ``strict`` stops at the first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from recsync.data.format import Layout
from recsync.data.reader import Chunk, Dataset
from recsync.metrics.progress import progress
from recsync.model_dir.outfile import (check_output, publish, remove_stale_temps,
                                       temp_path)
from recsync.model_dir.trained import TrainedModel, load_model
from recsync.safe_names import printable

OUTPUT_SUFFIXES = (".parquet", ".csv")
DEFAULT_BATCH = 8192


class ScoreWriter:
    """Appends (score, label) columns to a Parquet or CSV file being built beside ``out``."""

    def __init__(self, out: Path, with_label: bool, *, overwrite: bool = False):
        suffix = check_suffix(out)
        self.out, self.tmp, self.overwrite = out, temp_path(out), overwrite
        fields = [pa.field("score", pa.float32())]
        if with_label:
            fields.append(pa.field("label", pa.float32()))
        self.schema = pa.schema(fields)
        try:
            with self._writing():
                if suffix == ".parquet":
                    import pyarrow.parquet as pq
                    self.writer = pq.ParquetWriter(str(self.tmp), self.schema)
                else:
                    import pyarrow.csv as pacsv
                    self.writer = pacsv.CSVWriter(str(self.tmp), self.schema)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise
        self.rows = 0

    @contextlib.contextmanager
    def _writing(self):
        """The disk refusing the scores (full, an I/O error): OSError "cannot write OUT:
        REASON" in one line (pyarrow's are several)."""
        try:
            yield
        except OSError as e:
            reason = (os.strerror(e.errno) if e.errno else
                      (str(e).strip().splitlines() or [type(e).__name__])[0])
            raise OSError(e.errno, f"cannot write {self.out}: {reason}") from None

    def write(self, scores: np.ndarray, labels: np.ndarray | None) -> None:
        """NaN scores (bad raw rows) are written as nulls."""
        columns = [pa.array(scores, pa.float32(), mask=np.isnan(scores))]
        if len(self.schema) == 2:
            columns.append(pa.array(labels, pa.float32()))
        with self._writing():
            self.writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self.rows += len(scores)

    def close(self) -> None:
        with self._writing():
            self.writer.close()
        publish(self.tmp, self.out, overwrite=self.overwrite)

    def abort(self) -> None:
        """Remove the partial file (closing it may fail too, on a full disk: the first error
        is the one to report)."""
        with contextlib.suppress(Exception):
            self.writer.close()
        self.tmp.unlink(missing_ok=True)


def check_suffix(out: Path) -> str:
    suffix = out.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise ValueError(f"--out {out}: name it .parquet or .csv (the format follows the "
                         f"suffix)")
    return suffix


def check_layout(model: TrainedModel, ds: Dataset) -> None:
    """The data set must hold the columns and features the model was trained on, its ids
    hashed into tables of the training data's sizes; ValueError naming the difference.

    A table's size is part of its ids' meaning (a value's id is its hash modulo the size), so
    a data set hashed into smaller or larger tables than the training data's holds other ids
    for the same values: its scores would be wrong, in range or not. The sizes compared are
    the training data set's (model.json ``data.tables``), not the model's tables, which
    ``model.table_rows`` may have made larger than the data's (the ids stay those of the
    data's sizes)."""
    trained = Layout.from_meta(model.meta["data"])
    where = f"{ds.root}/meta.json"
    if ds.layout.dense != trained.dense:
        raise ValueError(f"{where}: dense columns {printable(list(ds.layout.dense), 200)} "
                         f"differ from the model's {printable(list(trained.dense), 200)}")
    if ds.layout.features != trained.features:
        raise ValueError(f"{where}: sparse features "
                         f"{printable([f.name for f in ds.layout.features], 200)} differ from "
                         f"the model's {printable([f.name for f in trained.features], 200)}")
    sizes = {t.name: t.rows for t in trained.tables}
    kinds = {t.name: t.dynamic for t in trained.tables}
    for t in ds.layout.tables:
        if t.name in kinds and t.dynamic != kinds[t.name]:
            kind = {True: "dynamic", False: "fixed"}
            raise ValueError(f"{where}: table {printable(t.name)} is {kind[t.dynamic]}, in the "
                             f"model's training data {kind[kinds[t.name]]}: its ids mean "
                             f"other values; convert the data as the training data was")
        if t.name in sizes and t.rows != sizes[t.name]:
            raise ValueError(f"{where}: table {printable(t.name)} has {t.rows:,} rows, the model's "
                             f"training data {sizes[t.name]:,}: its ids were hashed into "
                             f"another size and would score wrongly; convert the data with "
                             f"the training data's table sizes")
    mine = (ds.meta.get("preprocessing") or {}).get("hash")
    theirs = (model.meta["data"].get("preprocessing") or {}).get("hash")
    if mine and theirs and mine != theirs:
        raise ValueError(f"{where}: values hashed with {printable(mine)}, the model's "
                         f"training data with {printable(theirs)}: its ids would score wrongly")


def predict(model_dir: str | Path, inputs: list[str | Path], out: str | Path, *,
            split: str = "eval", batch_size: int = DEFAULT_BATCH, show_progress: bool = True,
            strict: bool = False, overwrite: bool = False, builder: str | None = None) -> dict:
    """Score ``inputs`` (one data set directory, or raw files) into ``out``; returns {"rows",
    "seconds", "out", "bad", "examples"} (bad raw rows: their count and the first ones).
    ``out`` replaces an existing file only with ``overwrite``, and never one of the inputs
    (outfile.check_output). ``builder``: a user's own model's builder, imported and run to
    rebuild it (recsync.load_model)."""
    begin = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    paths = [Path(p) for p in inputs]
    out = Path(out)
    check_suffix(out)
    check_output(out, overwrite=overwrite, inputs=[*paths, model_dir])
    load = {"builder": builder} if builder is not None else {}  # only a user's own model
    if len(paths) == 1 and paths[0].is_dir():
        model = load_model(model_dir, **load)
        ds = Dataset(paths[0])
        check_layout(model, ds)
        pieces = ((b, None) for b in _dataset_batches(ds, split, batch_size))
        total, labelled = ds.rows(split), True
    else:
        for p in paths:
            if p.is_dir():
                raise ValueError(f"{p}: give one data set directory, or raw files")
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file")
        model = load_model(model_dir, **load)
        from recsync.data.rows import RowPreprocessor
        prep = RowPreprocessor(model.meta["data"])  # a clear error where raw rows cannot be
        pieces = _raw_pieces(prep, paths, strict)  # scored (synthetic data)
        first = next(pieces, None)
        labelled = first is not None and not bool(first[0].label.isnan().all())
        pieces = itertools.chain([first] if first is not None else [], pieces)
        total = None
    remove_stale_temps(out)
    writer = ScoreWriter(out, labelled, overwrite=overwrite)
    bar = progress(total, "row", f"predict {out.name}", show_progress)
    bad, examples = 0, []
    try:
        for batch, kept in pieces:
            scores = np.concatenate(
                [model.score_batch(batch.take(torch.arange(i, min(i + batch_size, len(batch)))))
                 for i in range(0, len(batch), batch_size)] or [np.zeros(0, np.float32)])
            labels = batch.label.numpy()
            if kept is not None:  # raw rows: the bad ones get null, row for row with the input
                rows, kept, report = kept
                bad += report.bad
                examples += report.examples[:max(0, 10 - len(examples))]
                full, full_labels = (np.full(rows, np.nan, np.float32) for _ in range(2))
                full[kept], full_labels[kept] = scores, labels
                scores, labels = full, full_labels
            writer.write(scores, labels if labelled else None)
            bar.update(len(scores))
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    return {"rows": writer.rows, "seconds": time.perf_counter() - begin, "out": str(out),
            "bad": bad, "examples": examples}


def _raw_pieces(prep, paths: list[Path], strict: bool):
    """(batch, (records, kept positions within the piece, report)) per piece of each file."""
    for path in paths:
        start = 0  # the piece's first record in its file (reports count from the file's start)
        for batch, report in prep.files([path], strict=strict):
            yield batch, (report.rows, report.kept - start, report)
            start += report.rows


def _dataset_batches(ds: Dataset, split: str, batch_size: int):
    for p, info in enumerate(ds.meta["splits"][split]["parts"]):
        yield from ds.batches(Chunk(split, p, 0, info["rows"]), batch_size)
