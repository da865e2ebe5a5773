"""Inputs of `recsync data convert` (and raw-file scoring, recsync/data/rows.py) made by someone
else: each test is a reproduction of issue 29's findings on text and Parquet inputs, and what a
user gets instead: one line naming the file and line (or column, or schema key), memory bounded,
nothing echoed raw, nothing silently wrong.

    PYTHONPATH=. python -m pytest -q tests/unit/test_untrusted_inputs.py
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import recsync.data.convert_input as convert_input
from recsync.cli import main
from recsync.data import meta_checks
from recsync.data.convert import convert
from recsync.data.convert_input import ConvertError, open_source, text_blocks
from recsync.data.format import read_meta
from recsync.data.reader import Dataset
from recsync.data.rows import RowPreprocessor, preprocess, preprocess_files
from recsync.data.schema import SchemaError, parse_schema
from recsync.data.value_hash import hash_one, hash_text, ids_of

SCHEMA = """
[label]
column = "y"
[[dense]]
name = "x"
[[categorical]]
name = "c"
[tables.c]
rows = 1000
[split]
eval_fraction = 0.0
"""
GOOD = "1,2,a\n0,1,b\n1,3,c\n0,4,d\n"


def schema(text: str = SCHEMA):
    return parse_schema(text, "test schema")


def run(tmp_path: Path, data: str | bytes, sch: str = SCHEMA, name: str = "in.csv", **kw):
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    kw.setdefault("progress", False)
    return convert([path], schema(sch), tmp_path / "out", **kw)


def one_line(e) -> str:
    text = str(e.value if hasattr(e, "value") else e)
    assert "\n" not in text and "\r" not in text
    assert not any(ord(c) < 32 or ord(c) == 127 for c in text), repr(text)
    return text


def cid(text: str, rows: int = 1000) -> int:
    return 1 + hash_one(text) % (rows - 1)


# --------------------------------------------------------------------- quotes and line ends

def test_a_quoted_line_end_is_refused_naming_its_line(tmp_path):
    text = "y,x,c\n" + GOOD[:12] + '1,3,"two\nlines",z\n' + GOOD[12:]
    for block_bytes in [*range(1, 40), 1 << 20]:  # blocks cut inside the field, or not
        with pytest.raises(ConvertError, match=r"in.csv:4: a quoted field does not close on "
                                               r"its line") as e:
            run(tmp_path, text, block_bytes=block_bytes)
        one_line(e)
        assert not (tmp_path / "out").exists()


def test_an_unclosed_quote_names_file_and_line(tmp_path):
    with pytest.raises(ConvertError, match=r"in.csv:3: a quoted field does not close") as e:
        run(tmp_path, 'y,x,c\n1,2,a\n0,1,"b\n1,3,c\n0,4,d\n')
    one_line(e)


def test_quoted_fields_on_their_line_are_read(tmp_path):
    r = run(tmp_path, 'y,x,c\n1,2,"a,b"\n0,1,"say ""hi"""\n1,3,c\n')
    assert (r.rows_written, r.bad_lines) == (3, 0)
    sparse = np.load(tmp_path / "out" / "train" / "part-00000.sparse.npy")
    assert sparse[:, 0].tolist() == [cid("a,b"), cid('say "hi"'), cid("c")]


def test_a_carriage_return_inside_a_line_is_a_bad_row_and_the_lines_stay_right(tmp_path):
    r = run(tmp_path, "y,x,c\n1,2,a\rb\n0,1,b\n1,x,c\n\r\r\n0,4,d\n", block_bytes=1 << 20)
    got = [(e.where.split("/")[-1], e.reason) for e in r.examples]
    assert got == [("in.csv:2", "a carriage return inside the line (lines end with \\n or "
                                "\\r\\n)"),
                   ("in.csv:4", "'x' is not a number"),
                   ("in.csv:5", "a carriage return inside the line (lines end with \\n or "
                                "\\r\\n)")]
    assert (r.lines, r.rows_written) == (5, 2)


# ------------------------------------------------------------------------------ long lines

def test_a_line_over_the_bound_is_refused_with_bounded_memory(tmp_path, monkeypatch):
    bound = 1 << 20
    monkeypatch.setattr(convert_input, "MAX_LINE_BYTES", bound)
    path = tmp_path / "in.csv.gz"
    with gzip.open(path, "wb") as f:  # 30 MB on one line: once 30 s and GBs of memory
        f.write(b"y,x,c\n1,2,a\n0,1,")
        for _ in range(30):
            f.write(b"b" * (1 << 20))
        f.write(b"\n1,3,c\n")
    src = open_source(str(path), schema())
    tracemalloc.start()
    try:
        with pytest.raises(ConvertError, match=r"in.csv.gz:3: a line longer than 1,048,576 "
                                               r"bytes \(MAX_LINE_BYTES\)") as e:
            list(text_blocks(src, 1 << 16))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(e)
    assert peak < 3 * bound, peak
    with pytest.raises(ConvertError, match="in.csv.gz:3: a line longer than"):
        convert([path], schema(), tmp_path / "out", progress=False)


def test_a_long_run_of_blank_lines_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_input, "MAX_LINE_BYTES", 1 << 16)
    with pytest.raises(ConvertError, match=r"in.csv:3: a run of blank lines longer than"):
        run(tmp_path, "y,x,c\n1,2,a\n" + "\n" * (1 << 17) + "0,1,b\n", block_bytes=4096)


def test_long_lines_under_the_bound_convert(tmp_path):
    value = "v" * 300_000  # hashed a byte position at a time once: minutes a MB
    r = run(tmp_path, f"y,x,c\n1,2,{value}\n0,1,b\n", block_bytes=4096)
    sparse = np.load(tmp_path / "out" / "train" / "part-00000.sparse.npy")
    assert r.rows_written == 2 and sparse[0, 0] == cid(value)


def test_a_10_mb_first_line_is_one_line_not_a_csv_traceback(tmp_path):
    with pytest.raises(ConvertError, match=r"in.csv:1: the header cannot be read \(field "
                                           r"larger than field limit") as e:
        run(tmp_path, "y,x,c," + "h" * (10 << 20) + "\n1,2,a,z\n")
    one_line(e)
    sch = SCHEMA.replace("[label]", '[input]\nheader = false\ncolumns = ["y", "x", "c", "z"]'
                                    '\n[label]')
    r = run(tmp_path, "1,2,a," + "z" * (10 << 20) + "\n0,1,b,z\n", sch)  # data: just a line
    assert (r.rows_written, r.bad_lines) == (2, 0)


def test_long_values_hash_as_the_reference_does():
    values = ["%05d" % i + "w" * (300 + i) for i in range(40)] + ["q" * 70_000, "", "x"]
    h, present = hash_text(pa.array(values))
    assert h.tolist() == [hash_one(v) for v in values]
    assert present.tolist() == [v != "" for v in values]


# ---------------------------------------------------------------------------------- Parquet

UNREADABLE = {
    "struct": pa.array([{"a": 1}] * 2),
    "list<list>": pa.array([[[1]], [[2]]]),
    "timestamp": pa.array([datetime.datetime(2020, 1, 1)] * 2, pa.timestamp("us")),
}


@pytest.mark.parametrize("kind", UNREADABLE)
def test_parquet_columns_of_unreadable_types_are_named(tmp_path, kind):
    table = pa.table({"y": [1, 0], "x": UNREADABLE[kind], "c": ["a", "b"]})
    pq.write_table(table, tmp_path / "in.parquet")
    with pytest.raises(ConvertError) as e:
        convert([tmp_path / "in.parquet"], schema(), tmp_path / "out", progress=False)
    text = one_line(e)
    stored = pq.read_schema(tmp_path / "in.parquet").field("x").type
    assert text.startswith(f"{tmp_path / 'in.parquet'}: column 'x' has type {stored}, which "
                           f"recsync cannot read; ")
    meta = {"preprocessing": {"schema": schema().model_dump(mode="json"),
                              "hash": "fnv1a64-splitmix64", "standardize": {}}}
    with pytest.raises(ConvertError, match="column 'x' has type"):  # raw-file scoring
        list(preprocess_files([tmp_path / "in.parquet"], meta))
    with pytest.raises(ConvertError, match="<rows>: column 'x' has type"):  # in memory
        preprocess(table, meta)


def test_parquet_struct_multi_hot_and_dictionary_columns(tmp_path):
    sch = SCHEMA + '[[multi_hot]]\nname = "m"\nseparator = "|"\nmax_len = 4\n'
    table = pa.table({"y": [1, 0], "x": [1.0, 2.0], "c": pa.array(["a", "b"]).dictionary_encode(),
                      "m": pa.array(["a|b", "c"]).dictionary_encode()})
    pq.write_table(table, tmp_path / "in.parquet")
    r = convert([tmp_path / "in.parquet"], schema(sch), tmp_path / "out", progress=False)
    assert r.rows_written == 2
    values = np.load(tmp_path / "out" / "train" / "part-00000.multi0.values.npy")
    assert values.tolist() == [cid("a", 1_000_000), cid("b", 1_000_000), cid("c", 1_000_000)]
    pq.write_table(table.set_column(3, "m", pa.array([[[1]], [[2]]])), tmp_path / "b.parquet")
    with pytest.raises(ConvertError, match=r"b.parquet: column 'm' has type list<element: "
                                           r"list<element: int64>>, which recsync cannot read; "
                                           r"a multi-hot column holds"):
        convert([tmp_path / "b.parquet"], schema(sch), tmp_path / "out2", progress=False)


# ---------------------------------------------------------------------- bytes from anywhere

def test_binary_bytes_never_reach_a_message_raw(tmp_path, capfd):
    data = (b"y,x,c\n1,2,a\x1b[31m\xff\n0,1\x01,b\n1,3,c\xfe\x1b,extra\n0,\xff\x07,d\n"
            b"1,4,\x00\x9b\n")
    r = run(tmp_path, data, block_bytes=1 << 20)
    captured = capfd.readouterr()
    assert "Exception ignored" not in captured.err and "Traceback" not in captured.err
    got = [(e.where.split("/")[-1], e.column, e.reason) for e in r.examples]
    assert got == [("in.csv:3", "x", "'1\\x01' is not a number"),
                   ("in.csv:4", "", "expected 3 fields, got 4"),
                   ("in.csv:5", "x", "'\\xff\\x07' is not a number")]
    for e in r.examples:
        one_line(e.reason)
    sparse = np.load(tmp_path / "out" / "train" / "part-00000.sparse.npy")
    raw = pa.array([b"a\x1b[31m\xff", b"\x00\x9b"], pa.binary())  # hashed as the bytes they are
    assert sparse[:, 0].tolist() == ids_of(raw, 1000).tolist()
    with pytest.raises(ConvertError) as e:
        run(tmp_path, data, strict=True, overwrite=True)
    assert one_line(e).endswith("in.csv:3: column x: '1\\x01' is not a number (--strict)")
    with pytest.raises(ConvertError) as e:  # a file name is escaped too
        run(tmp_path, b"y,x,c\n", name="bad\x1b[2Jname.csv", overwrite=True)
    assert "bad\\x1b[2Jname.csv" in one_line(e)


# ------------------------------------------------------------------------ silent data cases

EVAL_ONLY = SCHEMA.replace("eval_fraction = 0.0", 'eval_files = ["*"]')


def test_no_train_rows_is_refused_unless_asked_for(tmp_path):
    with pytest.raises(ConvertError, match=r"in.csv: no train rows \(4 eval rows, 0 bad; eval: "
                                           r"inputs matching split.eval_files \['\*'\]\); pass "
                                           r"--allow-empty-train") as e:
        run(tmp_path, "y,x,c\n" + GOOD, EVAL_ONLY)
    one_line(e)
    assert not (tmp_path / "out").exists()
    r = run(tmp_path, "y,x,c\n" + GOOD, EVAL_ONLY, allow_empty_train=True)
    assert (r.train_rows, r.eval_rows) == (0, 4)
    assert read_meta(tmp_path / "out")["splits"]["train"]["rows"] == 0
    (tmp_path / "s.toml").write_text(EVAL_ONLY)
    args = ["data", "convert", str(tmp_path / "in.csv"), "--schema", str(tmp_path / "s.toml")]
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o2")])
    assert res.exit_code != 0 and "no train rows" in res.output
    res = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o2"), "--allow-empty-train"])
    assert res.exit_code == 0 and "0 train + 4 eval rows" in res.output


MULTI = '[[multi_hot]]\nname = "m"\nseparator = "|"\nmax_len = {}\n'


@pytest.mark.parametrize("edit, key", [
    (("rows = 1000", "rows = 1000\ndim = 1_000_000_000_000"), "tables.c.dim"),
    (("[split]", MULTI.format("1_000_000_000_000") + "[split]"), "multi_hot.0.max_len"),
    (("rows = 1000", f"rows = {meta_checks.MAX_TABLE_ROWS + 1}"), "tables.c.rows"),
])
def test_schema_bounds_are_the_readers(edit, key):
    with pytest.raises(SchemaError, match=f"^test schema: {key}: Input should be less than or "
                                          f"equal to") as e:
        schema(SCHEMA.replace(*edit))
    one_line(e)


def test_a_schema_at_the_bounds_gives_a_data_set_the_reader_opens(tmp_path):
    at = SCHEMA.replace("rows = 1000", f"rows = {meta_checks.MAX_TABLE_ROWS}\n"
                                       f"dim = {meta_checks.MAX_DIM}")
    at = at.replace("[split]", MULTI.format(meta_checks.MAX_LIST_LEN) + "[split]")
    run(tmp_path, "y,x,c,m\n1,2,a,a|b\n", at)
    data = Dataset(tmp_path / "out")  # meta.json checked as training checks it
    assert data.layout.tables[0].dim == meta_checks.MAX_DIM and data.rows("train") == 1
    for over, key in (((f"dim = {meta_checks.MAX_DIM}", f"dim = {meta_checks.MAX_DIM + 1}"),
                       "tables.c.dim"),
                      ((f"max_len = {meta_checks.MAX_LIST_LEN}",
                        f"max_len = {meta_checks.MAX_LIST_LEN + 1}"), "multi_hot.0.max_len"),
                      (('name = "c"', 'name = "c\\u0007"'), "categorical.0.name: 'c.x07'"),
                      (('name = "c"', f'name = "{"c" * 201}"'), "categorical.0.name")):
        with pytest.raises(SchemaError, match=key):
            schema(at.replace(*over))


def test_a_schema_without_tables_is_refused_since_the_reader_would_refuse_it():
    with pytest.raises(SchemaError, match=r"no sparse features: add \[\[categorical\]\]"):
        parse_schema('[label]\ncolumn = "y"\n[[dense]]\nname = "x"\n', "s")
    with pytest.raises(SchemaError, match=r"input.delimiter: 'é' cannot separate fields"):
        parse_schema('[input]\ndelimiter = "é"\n' + SCHEMA, "s")


# ------------------------------------------------------------- what a killed conversion left

def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def leftover(tmp_path: Path, kind: str, pid: int, foreign: bool = False) -> Path:
    d = tmp_path / f".out.recsync-{kind}-{pid}-0"
    (d / "train").mkdir(parents=True)
    (d / "train" / ("notes.txt" if foreign else "part-00000.dense.npy.tmp")).write_bytes(b"x")
    return d


def test_a_killed_conversions_staging_directory_is_removed_by_the_next(tmp_path, capfd):
    dead, alive = leftover(tmp_path, "tmp", dead_pid()), leftover(tmp_path, "tmp", os.getppid())
    foreign = tmp_path / "x"
    foreign = leftover(foreign, "tmp", dead_pid(), foreign=True)
    os.replace(foreign, tmp_path / foreign.name.replace("-0", "-1"))
    run(tmp_path, "y,x,c\n" + GOOD)
    assert not dead.exists() and alive.exists() and (tmp_path / foreign.name.replace("-0", "-1")
                                                     ).exists()
    assert f"removed {dead}, left by a conversion (process " in capfd.readouterr().err


def test_a_data_set_a_killed_conversion_was_replacing_is_put_back(tmp_path, capfd):
    run(tmp_path, "y,x,c\n" + GOOD)
    old = tmp_path / f".out.recsync-old-{dead_pid()}-0"
    os.rename(tmp_path / "out", old)  # killed between its two renames
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        run(tmp_path, "y,x,c\n" + GOOD)
    assert not old.exists() and json.loads((tmp_path / "out" / "meta.json").read_text())
    assert "put back" in capfd.readouterr().err


# ------------------------------------------------------------------ raw-file scoring (rows.py)

def test_raw_files_are_read_with_the_same_guards(tmp_path):
    run(tmp_path, "y,x,c\n" + GOOD)
    prep = RowPreprocessor(read_meta(tmp_path / "out"))
    (tmp_path / "q.csv").write_bytes(b'y,x,c\n1,2,a\n0,1,"b\n1,3,c\n')
    with pytest.raises(ConvertError, match=r"q.csv:3: a quoted field does not close"):
        list(prep.files([tmp_path / "q.csv"]))
    (tmp_path / "r.csv").write_bytes(b"y,x,c\n1,2,a\rb\n0,1,b\xff\x1b,z\n1,3,c\n")
    (batch, report), = prep.files([tmp_path / "r.csv"], strict=False)
    assert report.kept.tolist() == [2] and len(batch) == 1
    assert [(e.where.split("/")[-1], e.reason) for e in report.examples] == [
        ("r.csv:2", "a carriage return inside the line (lines end with \\n or \\r\\n)"),
        ("r.csv:3", "expected 3 fields, got 4")]
