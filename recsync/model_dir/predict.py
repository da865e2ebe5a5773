"""`recsync predict`: score every row of an input with a model directory, streamed in batches,
one ``score`` per row in input order (and ``label`` where the input has labels), written as
Parquet or CSV (by the output's suffix). The output appears under its name only once complete.

Inputs: a converted data set's split (rows in the split's order), or raw CSV/TSV/Parquet files
(plain or compressed) read and preprocessed exactly as ``recsync data convert`` read the
training data (recsync.data.rows). A bad raw row is skipped and counted like the conversion's
(its score is null, so the output stays row for row with the input) and the first ones are
named file:line; ``strict`` stops at the first.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from recsync.data.format import Layout
from recsync.data.reader import Chunk, Dataset
from recsync.model_dir.trained import TrainedModel, load_model
from recsync.progress import progress

OUTPUT_SUFFIXES = (".parquet", ".csv")
DEFAULT_BATCH = 8192


class ScoreWriter:
    """Appends (score, label) columns to a Parquet or CSV file being built beside ``out``."""

    def __init__(self, out: Path, with_label: bool):
        suffix = out.suffix.lower()
        if suffix not in OUTPUT_SUFFIXES:
            raise ValueError(f"--out {out}: name it .parquet or .csv (the format follows the "
                             f"suffix)")
        self.out, self.tmp = out, out.with_name(f".{out.stem}.tmp-{os.getpid()}{out.suffix}")
        fields = [pa.field("score", pa.float32())]
        if with_label:
            fields.append(pa.field("label", pa.float32()))
        self.schema = pa.schema(fields)
        if suffix == ".parquet":
            import pyarrow.parquet as pq
            self.writer = pq.ParquetWriter(str(self.tmp), self.schema)
        else:
            import pyarrow.csv as pacsv
            self.writer = pacsv.CSVWriter(str(self.tmp), self.schema)
        self.rows = 0

    def write(self, scores: np.ndarray, labels: np.ndarray | None) -> None:
        """NaN scores (bad raw rows) are written as nulls."""
        columns = [pa.array(scores, pa.float32(), mask=np.isnan(scores))]
        if len(self.schema) == 2:
            columns.append(pa.array(labels, pa.float32()))
        self.writer.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self.rows += len(scores)

    def close(self) -> None:
        self.writer.close()
        os.replace(self.tmp, self.out)

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def check_layout(model: TrainedModel, ds: Dataset) -> None:
    """The data set must hold the columns and features the model was trained on, with ids
    inside its tables; ValueError naming the difference."""
    trained = Layout.from_meta(model.meta["data"])
    where = f"{ds.root}/meta.json"
    if ds.layout.dense != trained.dense:
        raise ValueError(f"{where}: dense columns {list(ds.layout.dense)} differ from the "
                         f"model's {list(trained.dense)}")
    if ds.layout.features != trained.features:
        raise ValueError(f"{where}: sparse features {[f.name for f in ds.layout.features]} "
                         f"differ from the model's {[f.name for f in trained.features]}")
    for t in ds.layout.tables:
        spec = next((s for s in model.specs if s.source == t.name), None)
        if spec is not None and t.rows > spec.rows:
            raise ValueError(f"{where}: table {t.name} has {t.rows:,} rows, the model's "
                             f"{spec.rows:,}: ids would not fit")


def predict(model_dir: str | Path, inputs: list[str | Path], out: str | Path, *,
            split: str = "eval", batch_size: int = DEFAULT_BATCH, show_progress: bool = True,
            strict: bool = False) -> dict:
    """Score ``inputs`` (one data set directory, or raw files) into ``out``; returns {"rows",
    "seconds", "out", "bad", "examples"} (bad raw rows: their count and the first ones)."""
    begin = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    paths = [Path(p) for p in inputs]
    out = Path(out)
    if len(paths) == 1 and paths[0].is_dir():
        model = load_model(model_dir)
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
        model = load_model(model_dir)
        from recsync.data.rows import RowPreprocessor
        prep = RowPreprocessor(model.meta["data"])  # a clear error where raw rows cannot be
        pieces = _raw_pieces(prep, paths, strict)  # scored (synthetic data)
        first = next(pieces, None)
        labelled = first is not None and not bool(first[0].label.isnan().all())
        pieces = itertools.chain([first] if first is not None else [], pieces)
        total = None
    writer = ScoreWriter(out, labelled)
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
