"""A model made by the former `recsync data criteo` converter and a local run (commit fb20e10,
tests/fixtures/criteo_v1/make.py) scores unchanged, and the one conversion path writes exactly
the ids and values that converter wrote (its arrays are kept as dtype, shape and SHA-256 in
data_arrays.json, not as files: synthetic as they are, data files do not belong in the
repository)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import recsync
from recsync.cli import main
from recsync.data.reader import Dataset

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "criteo_v1"
NAMES = ["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]


def digests(root: Path) -> dict:
    """Each part file's array as data_arrays.json records them: dtype, shape, SHA-256."""
    return {str(p.relative_to(root)): {"dtype": str(a.dtype), "shape": list(a.shape),
                                       "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
            for p in sorted(root.glob("*/*.npy")) for a in [np.ascontiguousarray(np.load(p))]}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """raw.tsv converted as the former converter's data set was (make.py's options)."""
    out = tmp_path_factory.mktemp("criteo_v1") / "d"
    r = CliRunner().invoke(main, ["data", "criteo", str(FIXTURE / "raw.tsv"), "--out",
                                  str(out), "--table-size", "64", "--eval-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    return out


def raw_table() -> pa.Table:
    lines = [ln.split("\t") for ln in (FIXTURE / "raw.tsv").read_text().splitlines()]
    return pa.table({c: [ln[j] for ln in lines] for j, c in enumerate(NAMES)})


def test_the_alias_writes_what_the_former_converter_wrote(converted):
    old = json.loads((FIXTURE / "data_arrays.json").read_text())
    assert digests(converted) == old


def test_a_former_model_scores_raw_rows_unchanged(converted, tmp_path):
    assert Dataset(converted).rows("eval") == 24
    model = recsync.load_model(FIXTURE / "run" / "model")
    scores = model.score(raw_table())
    np.testing.assert_allclose(scores, np.load(FIXTURE / "raw_scores.npy"), rtol=0, atol=1e-6)
    # raw lines (which the former converter's models could not score) give the run's own
    # predictions for its eval rows, the last quarter of the file
    shutil.copy(FIXTURE / "raw.tsv", tmp_path / "raw.tsv")
    r = CliRunner().invoke(main, ["predict", "--model", str(FIXTURE / "run" / "model"),
                                  str(tmp_path / "raw.tsv"), "--out", str(tmp_path / "p.parquet")])
    assert r.exit_code == 0, r.output
    got = pq.read_table(tmp_path / "p.parquet").column("score").to_numpy()
    want = pq.read_table(FIXTURE / "run" / "predictions.parquet").column("score").to_numpy()
    assert len(got) == 96
    np.testing.assert_allclose(got[-24:], want, rtol=0, atol=1e-6)


def test_a_criteo_test_file_without_labels_is_scored(tmp_path):
    """39 fields, no label (Criteo's test.txt): read without the label column."""
    lines = (FIXTURE / "raw.tsv").read_text().splitlines()
    (tmp_path / "test.txt").write_text("\n".join(ln.split("\t", 1)[1] for ln in lines) + "\n")
    r = CliRunner().invoke(main, ["predict", "--model", str(FIXTURE / "run" / "model"),
                                  str(tmp_path / "test.txt"), "--out", str(tmp_path / "p.csv")])
    assert r.exit_code == 0, r.output
    table = pcsv.read_csv(tmp_path / "p.csv")
    assert table.column_names == ["score"]  # no labels to write
    np.testing.assert_allclose(table.column("score").to_numpy(),
                               np.load(FIXTURE / "raw_scores.npy"), rtol=0, atol=1e-6)
