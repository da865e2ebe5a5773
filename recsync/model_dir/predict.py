"""`recsync predict`: score every row of an input with a model directory, streamed in batches,
one ``score`` per row in input order (and ``label`` where the input has labels), written as
Parquet or CSV (by the output's suffix). The output appears under its name only once complete.

Inputs: a converted data set's split (rows in the split's order). Raw CSV/TSV/Parquet files
need the conversion's preprocessing of raw rows (recsync.data.rows), not in this recsync yet.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from recsync.data.format import Layout
from recsync.data.reader import Chunk, Dataset
from recsync.model_dir.trained import TrainedModel, load_model
from recsync.progress import progress

OUTPUT_SUFFIXES = (".parquet", ".csv")
DEFAULT_BATCH = 8192
RAW_NOT_YET = ("`recsync predict` on raw CSV/TSV/Parquet files is not available in this recsync "
               "yet (it needs the conversion's preprocessing of raw rows, recsync.data.rows); "
               "convert the files with `recsync data convert` and give the data set directory")


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
        columns = [pa.array(scores, pa.float32())]
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
            split: str = "eval", batch_size: int = DEFAULT_BATCH, show_progress: bool = True
            ) -> dict:
    """Score ``inputs`` (one data set directory, or raw files) into ``out``; returns {"rows",
    "seconds", "out"}."""
    begin = time.perf_counter()
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    paths = [Path(p) for p in inputs]
    out = Path(out)
    if len(paths) == 1 and paths[0].is_dir():
        model = load_model(model_dir)
        ds = Dataset(paths[0])
        check_layout(model, ds)
        batches, total, labelled = _dataset_batches(ds, split, batch_size), ds.rows(split), True
    else:
        for p in paths:
            if p.is_dir():
                raise ValueError(f"{p}: give one data set directory, or raw files")
            if not p.is_file():
                raise FileNotFoundError(f"{p}: no such file")
        raise NotImplementedError(RAW_NOT_YET)
    writer = ScoreWriter(out, labelled)
    bar = progress(total, "row", f"predict {out.name}", show_progress)
    try:
        for batch in batches:
            writer.write(model.score_batch(batch),
                         None if batch.label is None else batch.label.numpy())
            bar.update(len(batch))
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    return {"rows": writer.rows, "seconds": time.perf_counter() - begin, "out": str(out)}


def _dataset_batches(ds: Dataset, split: str, batch_size: int):
    for p, info in enumerate(ds.meta["splits"][split]["parts"]):
        yield from ds.batches(Chunk(split, p, 0, info["rows"]), batch_size)
