"""`recsync predict` and load_model(...).score on raw rows: a model trained on a converted CSV
scores the CSV's own lines as it scores the converted rows (one score per input line, in
order; a bad line's score is null and it is reported as the conversion reports it)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import recsync
from recsync.cli import main
from recsync.config import load_config
from recsync.data.reader import Batch
from recsync.data.schema import parse_schema
from recsync.run.driver import run
from test_rows import BAD, ROWS, SCHEMA, converted, read_text, whole  # noqa: F401


def converted_rows(ds) -> Batch:
    """Every converted row, train then eval (the input's order), as the model's tensors."""
    b = whole(ds)
    t = torch.from_numpy
    return Batch(t(b.dense), t(b.sparse), t(b.label), None if b.weight is None else t(b.weight),
                 tuple((t(v.astype(np.int64)), t(o.astype(np.int64))) for v, o in b.multi))


@pytest.fixture(scope="module")
def model_dir(converted, tmp_path_factory):  # noqa: F811
    ds, _ = converted
    out = tmp_path_factory.mktemp("run")
    cfg = load_config(None, [f"data.path={json.dumps(str(ds.root))}", "model.embedding_dim=4",
                             "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.batch_size=2",
                             "train.epochs=3", "output.progress=false", "output.plot=false"])
    run(cfg, out)
    return out / "model"


def test_raw_lines_score_as_their_converted_rows_and_bad_lines_score_null(
        converted, model_dir, tmp_path):  # noqa: F811
    ds, csv_path = converted
    model = recsync.load_model(model_dir)
    want = model.score_batch(converted_rows(ds))  # the converted rows, in input order
    result = CliRunner().invoke(main, ["predict", "--model", str(model_dir), str(csv_path),
                                       "--out", str(tmp_path / "p.parquet")])
    assert result.exit_code == 0, result.output
    assert f"{len(BAD)} bad rows scored null" in result.output
    assert f"{csv_path.name}:{BAD[0] + 2}" in result.output  # file:line (after the header)
    scores = pq.read_table(tmp_path / "p.parquet")["score"].to_pylist()
    assert len(scores) == len(ROWS)
    assert [i for i, v in enumerate(scores) if v is None] == BAD
    good = np.array([v for v in scores if v is not None], np.float32)
    np.testing.assert_allclose(good, want, rtol=0, atol=1e-6)
    strict = CliRunner().invoke(main, ["predict", "--model", str(model_dir), str(csv_path),
                                       "--strict", "--out", str(tmp_path / "s.parquet")])
    assert strict.exit_code == 2 and f":{BAD[0] + 2}" in strict.output
    assert not (tmp_path / "s.parquet").exists()


def test_load_model_scores_raw_rows_in_memory(converted, model_dir):  # noqa: F811
    ds, csv_path = converted
    model = recsync.load_model(model_dir)
    table = read_text(csv_path, parse_schema(SCHEMA, "test"))
    keep = [i for i in range(len(ROWS)) if i not in BAD]
    np.testing.assert_allclose(model.score(table.take(keep).drop(["rating"])),
                               model.score_batch(converted_rows(ds)), rtol=0, atol=1e-6)
