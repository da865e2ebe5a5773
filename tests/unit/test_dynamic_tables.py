"""Dynamic tables, the data side (issue 33): the schema's table kind, ids that are the values'
full 64-bit hashes on every conversion path, meta.json's record of it, and the reader's id checks
(which take any int64 of a dynamic table and still refuse ids past a fixed table's end).

    PYTHONPATH=. python -m pytest -q -p no:xdist tests/unit/test_dynamic_tables.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.data.convert import convert
from recsync.data.criteo import criteo_schema
from recsync.data.format import (DataFormatError, Feature, Layout, SplitWriter, Table,
                                 read_meta, write_meta)
from recsync.data.hashing import splitmix64
from recsync.data.reader import Dataset
from recsync.data.rows import preprocess_table
from recsync.data.schema import SchemaError, parse_schema
from recsync.data.value_hash import dynamic_ids, hash_one, to_ids
from recsync.model.inputs import inputs_of

SCHEMA = """
[label]
column = "y"
[[categorical]]
name = "c"
[[categorical]]
name = "f"
[[multi_hot]]
name = "m"
table = "c"
separator = "|"
max_len = 3
[tables.c]
kind = "dynamic"
[tables.f]
rows = 1000
[split]
eval_fraction = 0
"""
ROWS = [("1", "apple", "red", "apple|pear"), ("0", "", "blue", "kiwi||fig|plum|lime"),
        ("1", "zz", "", "")]


def full(text: str) -> int:
    """A dynamic table's id of ``text``: its full hash as an int64."""
    return int(np.array([hash_one(text)], dtype=np.uint64).view(np.int64)[0])


def write_csv(path, quoted: bool = False) -> None:
    q = '"' if quoted else ""  # a quote sends the block through pyarrow's CSV reader
    path.write_text("y,c,f,m\n" + "".join(f"{y},{q}{c}{q},{f},{m}\n" for y, c, f, m in ROWS))


def arrays(out) -> dict[str, np.ndarray]:
    return {p.name[len("part-00000."):-len(".npy")]: np.load(p)
            for p in (out / "train").glob("part-00000.*.npy")}


# ---------------------------------------------------------------------------------- the schema

def test_a_table_is_fixed_unless_its_entry_or_the_defaults_say_dynamic():
    base = '[label]\ncolumn = "y"\n[[categorical]]\nname = "a"\n[[categorical]]\nname = "b"\n'
    s = parse_schema(base, "t")
    assert (s.table_kind("a"), s.table_kind("b")) == ("fixed", "fixed")
    s = parse_schema(base + '[tables.a]\nkind = "dynamic"\n', "t")
    assert (s.table_kind("a"), s.table_kind("b")) == ("dynamic", "fixed")
    assert s.table_rows("a") == 1_000_000  # rows unset: the default, what the table is sized for
    s = parse_schema(base + '[defaults]\ntable_kind = "dynamic"\n[tables.b]\nkind = "fixed"\n'
                            'rows = 50\n', "t")
    assert (s.table_kind("a"), s.table_kind("b"), s.table_rows("b")) == ("dynamic", "fixed", 50)
    every = s.with_table_kind("dynamic")
    assert (every.table_kind("a"), every.table_kind("b"), every.table_rows("b")) == \
        ("dynamic", "dynamic", 50)


@pytest.mark.parametrize("extra, message", [
    ('[tables.c]\nkind = "hashed"\n', r"t: tables.c.kind: Input should be 'fixed' or 'dynamic'"),
    ('[defaults]\ntable_kind = "Dynamic"\n', r"t: defaults.table_kind: Input should be"),
    ('[tables.c]\nkind = "dynamic"\nrows = 1\n', r"t: tables.c.rows: Input should be greater"),
    ('[tables.c]\nkind = true\n', r"t: tables.c.kind: Input should be"),
])
def test_bad_kinds_are_refused_in_one_line_naming_the_key(extra, message):
    with pytest.raises(SchemaError, match=message) as e:
        parse_schema('[label]\ncolumn = "y"\n[[categorical]]\nname = "c"\n' + extra, "t")
    assert "\n" not in str(e.value)
    with pytest.raises(SchemaError, match="table kind 'odd'"):
        parse_schema('[label]\ncolumn = "y"\n[[categorical]]\nname = "c"\n', "t") \
            .with_table_kind("odd")


# ---------------------------------------------------------------------------------- the ids

def test_dynamic_ids_are_the_full_hash_and_zero_stays_missing():
    h = np.array([0, 1, 2**63, 2**64 - 1, 12345], dtype=np.uint64)
    got = dynamic_ids(h, np.array([True, True, True, True, False]))
    assert got.dtype == np.int64
    assert got.tolist() == [1, 1, -2**63, -1, 0]  # a hash of 0 is id 1 (0 is missing)
    assert to_ids(h, None).tolist() == [1, 1, -2**63, -1, 12345]
    assert to_ids(h, 1000).tolist() == (1 + h % np.uint64(999)).astype(np.int64).tolist()


@pytest.mark.parametrize("quoted", [False, True], ids=["fast path", "pyarrow reader"])
def test_conversion_writes_full_hashes_single_and_multi_hot_and_fixed_ids_unchanged(
        tmp_path, quoted):
    write_csv(tmp_path / "in.csv", quoted)
    convert([tmp_path / "in.csv"], parse_schema(SCHEMA, "t"), tmp_path / "out", progress=False)
    a = arrays(tmp_path / "out")
    assert a["sparse"].dtype == np.int64  # a dynamic table never fits int32
    assert a["sparse"][:, 0].tolist() == [full("apple"), 0, full("zz")]
    assert a["sparse"][:, 1].tolist() == [1 + hash_one(v) % 999 if v else 0
                                          for v in ("red", "blue", "")]
    assert a["multi0.values"].tolist() == [full(v) for v in ("apple", "pear", "kiwi", "fig",
                                                             "plum")]  # cut to max_len 3
    assert a["multi0.offsets"].tolist() == [0, 2, 5, 5]
    assert full("apple") < 0 < full("zz")  # hashes of 2^63 and above are negative ids


def test_hex32_categories_of_a_dynamic_table_are_their_integers_full_hash(tmp_path):
    line = "\t".join(["1"] + ["1"] * 13 + ["68fd1e64", "68FD1E64", "nothex", ""] + [""] * 22)
    (tmp_path / "day.txt").write_text(line + "\n")
    schema = criteo_schema(eval_fraction=0.0, dynamic=True)
    convert([tmp_path / "day.txt"], schema, tmp_path / "out", progress=False)
    ids = arrays(tmp_path / "out")["sparse"][0]
    want = int(splitmix64(np.array([0x68FD1E64], dtype=np.uint64)).view(np.int64)[0])
    assert ids[:4].tolist() == [want, want, full("nothex"), 0] and not ids[4:].any()
    fixed = criteo_schema(eval_fraction=0.0)  # a fixed table's id, as ever
    convert([tmp_path / "day.txt"], fixed, tmp_path / "fixed", progress=False)
    h = int(splitmix64(np.array([0x68FD1E64], dtype=np.uint64))[0])
    assert arrays(tmp_path / "fixed")["sparse"][0, :2].tolist() == [1 + h % 999_999] * 2


def test_raw_rows_score_with_the_ids_of_the_dynamic_data_set(tmp_path):
    write_csv(tmp_path / "in.csv")
    convert([tmp_path / "in.csv"], parse_schema(SCHEMA, "t"), tmp_path / "out", progress=False)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    batch = preprocess_table({"c": ["apple", "zz"], "f": ["red", "red"], "m": ["pear", ""]}, meta)
    assert batch.sparse[:, 0].tolist() == [full("apple"), full("zz")]
    assert batch.multi[0][0].tolist() == [full("pear")]


# ------------------------------------------------------------------------------ meta.json, reader

def test_meta_records_the_kind_and_the_model_sees_it(tmp_path):
    write_csv(tmp_path / "in.csv")
    convert([tmp_path / "in.csv"], parse_schema(SCHEMA, "t"), tmp_path / "out", progress=False)
    meta = read_meta(tmp_path / "out")
    assert meta["tables"] == [{"name": "c", "rows": 1_000_000, "kind": "dynamic"},
                              {"name": "f", "rows": 1000}] and meta["id_dtype"] == "int64"
    ds = Dataset(tmp_path / "out")
    assert [(t.name, t.dynamic) for t in ds.layout.tables] == [("c", True), ("f", False)]

    class Model:
        table_rows, embedding_dim = 0, 8
    tables = inputs_of(ds, Model()).tables
    assert [(t.name, t.rows, t.dynamic) for t in tables] == [("c", 1_000_000, True),
                                                             ("f", 1000, False)]
    Model.table_rows = 5000  # at least every fixed table's rows; a dynamic one's may be more
    assert [t.rows for t in inputs_of(ds, Model()).tables] == [5000, 5000]
    Model.table_rows = 999
    with pytest.raises(ValueError, match=r"smaller than the data set's largest table \(f: "):
        inputs_of(ds, Model())
    batch = ds.read(ds.chunks("train", 10)[0])  # full hashes pass the reader's checks
    assert batch.sparse[0, 0] == full("apple")


def test_a_data_set_without_kinds_reads_as_fixed(tmp_path):
    write_csv(tmp_path / "in.csv")
    schema = parse_schema(SCHEMA.replace('kind = "dynamic"', "rows = 500"), "t")
    convert([tmp_path / "in.csv"], schema, tmp_path / "out", progress=False)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert all("kind" not in t for t in meta["tables"]) and meta["id_dtype"] == "int32"
    assert not any(t.dynamic for t in Dataset(tmp_path / "out").layout.tables)


def write_ids(root, single: np.ndarray, values: np.ndarray, dynamic: tuple[bool, bool]) -> None:
    """A data set with single-hot features a (table A) and b (table B), and multi-hot m reading
    table A; ``dynamic``: which of A and B are dynamic. 2 rows."""
    layout = Layout(dense=(), features=(Feature("a", "A"), Feature("b", "B"),
                                        Feature("m", "A", "sum", 4)),
                    tables=(Table("A", 10, None, dynamic[0]), Table("B", 10, None, dynamic[1])))
    w = SplitWriter(root, "train", layout=layout)
    w.write(np.zeros((2, 0), np.float32), single, np.zeros(2, np.float32),
            multi=[(values, np.array([0, 1, len(values)]))])
    write_meta(root, layout=layout, splits={"train": w.close()}, source={"kind": "test"})


HUGE = [-1, -2**63, 2**63 - 1, 10]


def test_the_reader_takes_any_int64_of_a_dynamic_table(tmp_path):
    single = np.array([[-1, 9], [2**63 - 1, 0]], dtype=np.int64)
    write_ids(tmp_path, single, np.array(HUGE, dtype=np.int64), (True, False))
    ds = Dataset(tmp_path)
    b = ds.read(ds.chunks("train", 2)[0])
    assert b.sparse.tolist() == single.tolist() and b.multi[0][0].tolist() == HUGE


@pytest.mark.parametrize("single, values, where", [
    ([[5, 10], [0, 0]], [1, 2], r"row 0, column 1 \(feature b, table B\): id 10 is outside "
                                r"\[0, 10\)"),
    ([[5, -1], [0, 0]], [1, 2], r"row 0, column 1 \(feature b, table B\): id -1 is outside"),
    ([[5, 1], [0, 0]], [1, 2], None)])
def test_the_reader_still_refuses_ids_past_a_fixed_tables_end(tmp_path, single, values, where):
    write_ids(tmp_path, np.array(single, dtype=np.int64), np.array(values), (True, False))
    ds = Dataset(tmp_path)
    if where is None:
        ds.read(ds.chunks("train", 2)[0])
        return
    with pytest.raises(DataFormatError, match=where):
        ds.read(ds.chunks("train", 2)[0])


def test_a_fixed_multi_hot_table_is_still_checked(tmp_path):
    write_ids(tmp_path, np.array([[1, 1], [1, 1]]), np.array([3, -5]), (False, True))
    ds = Dataset(tmp_path)
    with pytest.raises(DataFormatError, match=r"value 1 \(feature m, table A\): id -5"):
        ds.read(ds.chunks("train", 2)[0])


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["tables"][0].update(kind="hashed"),
     r"meta.json: tables\[0\].kind \(table 'A'\) must be one of fixed, dynamic, got 'hashed'"),
    (lambda m: m.update(id_dtype="int32"),
     r"meta.json: id_dtype is int32 but a table is dynamic")])
def test_meta_with_a_bad_kind_is_refused(tmp_path, edit, message):
    write_ids(tmp_path, np.array([[1, 1], [1, 1]]), np.array([3, 5]), (True, False))
    meta = json.loads((tmp_path / "meta.json").read_text())
    edit(meta)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=message):
        Dataset(tmp_path)


# ------------------------------------------------------------------------------------ the CLI

def test_cli_dynamic_makes_every_table_dynamic(tmp_path):
    line = "\t".join(["0"] + ["2"] * 13 + ["68fd1e64"] * 26)
    (tmp_path / "day.txt").write_text((line + "\n") * 3)
    r = CliRunner().invoke(main, ["data", "criteo", str(tmp_path / "day.txt"), "--out",
                                  str(tmp_path / "o"), "--dynamic", "--table-size", "1000"])
    assert r.exit_code == 0, r.output
    meta = read_meta(tmp_path / "o")
    assert {(t["rows"], t.get("kind")) for t in meta["tables"]} == {(1000, "dynamic")}
    assert "--dynamic" in CliRunner().invoke(main, ["data", "criteo", "--help"]).output
    write_csv(tmp_path / "in.csv")
    (tmp_path / "s.toml").write_text(SCHEMA.replace('kind = "dynamic"', 'kind = "fixed"'))
    r = CliRunner().invoke(main, ["data", "convert", str(tmp_path / "in.csv"), "--schema",
                                  str(tmp_path / "s.toml"), "--out", str(tmp_path / "c"),
                                  "--dynamic"])
    assert r.exit_code == 0, r.output
    assert [t.get("kind") for t in read_meta(tmp_path / "c")["tables"]] == ["dynamic"] * 2
