"""Crafted data directories are refused with one line naming the file: part names that are paths,
table sizes out of bounds or beyond memory, part files of the wrong shape or dtype, ids outside
their table. Run: pytest -q tests/unit/test_data_validation.py"""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.config import ModelConfig, TrainConfig
from recsync.data.format import (MAX_INT32_ROWS, MAX_TABLE_ROWS, NUM_DENSE, NUM_TABLES,
                                 DataFormatError, part_paths)
from recsync.data.reader import Chunk, Dataset
from recsync.embedding.memory import TableMemoryError, check_table_memory, table_bytes
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore
from recsync.run.local_run import build_local_model
from test_reader import TABLE_ROWS, make_dataset


@pytest.fixture
def root(tmp_path):
    return make_dataset(tmp_path / "data")


def edit_meta(root, edit) -> None:
    meta = json.loads((root / "meta.json").read_text())
    edit(meta)
    (root / "meta.json").write_text(json.dumps(meta))


def refused(call, *needles) -> str:
    """The one-line DataFormatError ``call`` raises; it must contain every needle."""
    with pytest.raises(DataFormatError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert str(needle) in msg, (needle, msg)
    return msg


# ------------------------------------------------------------------------- meta.json on open

def test_part_name_with_a_path_is_refused_before_anything_outside_is_read(root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for kind, path in part_paths(outside, "evil").items():  # a readable target, were it trusted
        np.save(path, np.load(part_paths(root / "train", "part-00000")[kind]))

    def traverse(meta):
        meta["splits"]["train"]["parts"][0]["name"] = "../../outside/evil"
    edit_meta(root, traverse)
    refused(lambda: Dataset(root), root / "meta.json", "splits.train.parts[0].name",
            "../../outside/evil")


@pytest.mark.parametrize("name", ["part-00000/../part-00001", "/etc/passwd", "part-0000",
                                  "part-00000\n", "part-00001", 7])
def test_part_names_must_be_part_numbers(root, name):
    def rename(meta):
        meta["splits"]["train"]["parts"][0]["name"] = name
    edit_meta(root, rename)
    msg = refused(lambda: Dataset(root), root / "meta.json", "splits.train.parts[")
    # "part-00001" is refused where it repeats: at the second part
    assert re.search(r"parts\[[01]\]\.name (must be part-NNNNN|repeats)", msg)


def test_part_symlinked_out_of_the_directory_is_refused(root, tmp_path):
    target = tmp_path / "elsewhere.npy"
    path = part_paths(root / "train", "part-00001")["dense"]
    np.save(target, np.load(path))
    path.unlink()
    path.symlink_to(target)
    ds = Dataset(root)
    refused(lambda: ds.parts("train"), path, "outside the data directory")


@pytest.mark.parametrize("rows", [MAX_TABLE_ROWS + 1, 0, -5, 1.5, "100", True, None])
def test_table_rows_out_of_bounds_are_refused_on_open(root, rows):
    def resize(meta):
        meta["tables"][3]["rows"] = rows
    edit_meta(root, resize)
    refused(lambda: Dataset(root), root / "meta.json", "tables[3].rows", "C4")


@pytest.mark.parametrize("key, value, needle", [
    ("num_dense", 10**12, "num_dense"),
    ("tables", [{"name": "C1", "rows": 10}], "tables"),
    ("splits", {"train": {"rows": 1, "parts": []}}, "splits.train.rows"),
    ("splits", {"../x": {"rows": 0, "parts": []}}, "unknown split"),
    ("splits", [], "splits"),
])
def test_meta_keys_are_checked_on_open(root, key, value, needle):
    edit_meta(root, lambda meta: meta.__setitem__(key, value))
    refused(lambda: Dataset(root), root / "meta.json", needle)


def test_meta_json_that_is_not_an_object(root):
    (root / "meta.json").write_text("[1, 2]")
    refused(lambda: Dataset(root), root / "meta.json", "JSON object")


# ------------------------------------------------------------------------- part files

@pytest.mark.parametrize("kind, array, needle", [
    ("dense", np.zeros((100, NUM_DENSE - 1), np.float32), "[100, 12]"),
    ("dense", np.zeros((100, NUM_DENSE), np.float64), "float64"),
    ("sparse", np.zeros((100, NUM_TABLES), np.int64), "int64"),
    ("label", np.zeros((100, 1), np.float32), "[100, 1]"),
    ("label", np.zeros(99, np.float32), "99 rows"),
    ("label", np.float32(1), "0 rows"),
])
def test_part_of_the_wrong_shape_or_dtype_is_refused(root, kind, array, needle):
    path = part_paths(root / "train", "part-00001")[kind]
    np.save(path, array)
    ds = Dataset(root)
    refused(lambda: ds.parts("train"), path, needle)


def test_part_that_is_not_npy_is_refused(root):
    path = part_paths(root / "eval", "part-00000")["sparse"]
    path.write_bytes(b"\x93NUMPY\x01\x00garbage")
    refused(lambda: Dataset(root).parts("eval"), path, "cannot be read")


# ------------------------------------------------------------------------- ids per chunk

def put_id(root, part: int, row: int, column: int, value: int) -> None:
    path = part_paths(root / "train", f"part-{part:05d}")["sparse"]
    sparse = np.load(path)
    sparse[row, column] = value
    np.save(path, sparse)


@pytest.mark.parametrize("value", [TABLE_ROWS[5], -1, 2**31 - 1])
def test_out_of_range_id_names_the_file_row_and_table(root, value):
    put_id(root, part=1, row=42, column=5, value=value)
    ds = Dataset(root)
    ds.read(Chunk("train", 1, 0, 40))  # rows before it read fine
    sparse = part_paths(root / "train", "part-00001")["sparse"]
    for read in (lambda: ds.read(Chunk("train", 1, 40, 60)),
                 lambda: list(ds.batches(Chunk("train", 1, 0, 100), 16)),
                 lambda: list(ds.batches(Chunk("train", 1, 0, 100), 16, shuffle_seed=3)),
                 lambda: ds.read(Chunk("train", 1, 30, 60), rows=np.array([3, 12, 0]))):
        refused(read, sparse, "row 42,", "column 5", "table C6", f"id {value}",
                f"[0, {TABLE_ROWS[5]})")


def test_data_format_error_survives_pickling(root):
    """Workers raise it inside Ray actors: it must reach the driver whole."""
    put_id(root, part=0, row=3, column=0, value=-7)
    with pytest.raises(DataFormatError) as e:
        Dataset(root).read(Chunk("train", 0, 0, 10))
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is DataFormatError and str(again) == str(e.value)


# ------------------------------------------------------------------------- table memory

def test_table_bytes_counts_weights_state_and_flags():
    assert table_bytes([10, 5], dim=4, state_dim=1) == 15 * (5 * 4 + 1)
    assert table_bytes([10], dim=4, state_dim=0) == 10 * (4 * 4 + 1)


def test_check_table_memory_refuses_with_the_estimate():
    assert check_table_memory([1000], 16, limit_bytes=10**6) == 1000 * 69
    with pytest.raises(TableMemoryError) as e:
        check_table_memory([10, MAX_INT32_ROWS], 16, table_names=["a", "big"],
                           limit_bytes=64 * 2**30)
    msg = str(e.value)
    assert "\n" not in msg and "need about 148.2 GB" in msg and "68.7 GB" in msg
    assert "big with 2,147,483,647 rows" in msg
    assert isinstance(e.value, ValueError)  # a user error to the CLI


def test_store_refuses_huge_tables_before_allocating():
    tables = [TableSpec("C1", MAX_INT32_ROWS, 16)] * NUM_TABLES
    with pytest.raises(TableMemoryError, match="embedding tables need about"):
        EmbeddingStore(tables, make_row_optimizer("adagrad", 0.1))


def test_huge_table_rows_in_meta_json_refused_by_a_local_run(root):
    def grow(meta):  # a valid id range, but 137 GB of rows per table
        for t in meta["tables"]:
            t["rows"] = MAX_INT32_ROWS
    edit_meta(root, grow)
    ds = Dataset(root)
    with pytest.raises(TableMemoryError, match=r"GB .*C1 with 2,147,483,647 rows"):
        build_local_model(ModelConfig(embedding_dim=16), TrainConfig(), ds)


# ------------------------------------------------------------------------- through the CLI

def train(root, out):
    return CliRunner().invoke(main, ["train", "--out", str(out), "--set", f"data.path={root}",
                                     "--set", "model.embedding_dim=2", "--set",
                                     "model.bottom_mlp=[4]", "--set", "model.top_mlp=[4]",
                                     "--set", "output.plot=false", "--set",
                                     "output.progress=false"])


@pytest.mark.parametrize("craft, needle", [
    (lambda root: edit_meta(root, lambda m: m["splits"]["train"]["parts"][0].update(
        name="../../outside/evil")), "splits.train.parts[0].name"),
    (lambda root: edit_meta(root, lambda m: [t.update(rows=MAX_INT32_ROWS)
                                             for t in m["tables"]]),
     "embedding tables need about"),
    (lambda root: np.save(part_paths(root / "train", "part-00002")["dense"],
                          np.zeros((50, 3), np.float32)), "part-00002.dense.npy"),
])
def test_train_on_a_crafted_data_set_is_refused_with_one_line(root, tmp_path, craft, needle):
    craft(root)
    result = train(root, tmp_path / "run")
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert needle in lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_out_of_range_ids_stop_the_run_with_one_line(root, tmp_path):
    """Ids are checked as chunks are read, so a bad one is found mid-run: the run fails with
    its summary written and one error line naming the file and row."""
    put_id(root, part=2, row=7, column=25, value=10**6)
    result = train(root, tmp_path / "run")
    needle = "part-00002.sparse.npy: row 7, column 25 (table C26)"
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], result.output
    assert not re.search(r"Traceback|IndexError|RayTaskError", result.output)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and needle in summary["error"]
