"""`recsync data convert` (recsync/data/convert.py): bad input, compression and Parquet, splits,
statistics, nothing half-written, and every real sample in ../shared/data with its preset
(skipped where that folder is absent; RECSYNC_SHARED_DATA points elsewhere).

    PYTHONPATH=. python -m pytest -q tests/unit/test_convert.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.data.convert import convert
from recsync.data.convert_input import ConvertError
from recsync.data.format import Layout, part_paths
from recsync.data.schema import load_preset, parse_schema
from recsync.data.value_hash import hash_one

SHARED = Path(os.environ.get("RECSYNC_SHARED_DATA")
              or Path(__file__).resolve().parents[3] / "shared" / "data")

SCHEMA = """
[label]
column = "y"
[[dense]]
name = "x"
transform = "log1p"
[[categorical]]
name = "c"
[tables.c]
rows = 1000
[[multi_hot]]
name = "m"
table = "c"
separator = "|"
max_len = 2
[split]
eval_fraction = 0.25
"""
HEADER = "y,x,c,m\n"
ROWS = "1,3,a,a|b\n0,,b,\n1,7,,c\n0,0,a,b|a|c\n"


def schema(text: str = SCHEMA, **patch):
    return parse_schema(text, "test schema")


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def load(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """{split: {kind: array}} concatenated over the split's parts."""
    meta = json.loads((out / "meta.json").read_text())
    layout = Layout.from_meta(meta)
    got = {}
    for split, info in meta["splits"].items():
        arrays: dict[str, list] = {}
        for part in info["parts"]:
            for kind, path in part_paths(out / split, part["name"], layout).items():
                arrays.setdefault(kind, []).append(np.load(path))
        got[split] = {k: np.concatenate(v) for k, v in arrays.items()} if arrays else {}
    return got


def run(tmp_path, text=HEADER + ROWS, sch=SCHEMA, name="in.csv", **kw):
    src = write(tmp_path / name, text) if text is not None else tmp_path / name
    kw.setdefault("progress", False)
    kw.setdefault("block_bytes", 16)  # several pieces even for a few lines
    return convert([src], schema(sch), tmp_path / "out", **kw)


def cid(text: str, rows: int = 1000) -> int:
    return 1 + hash_one(text) % (rows - 1)


# ------------------------------------------------------------------------------ what is written

def test_rows_ids_lists_and_split(tmp_path):
    r = run(tmp_path)
    assert (r.lines, r.train_rows, r.eval_rows, r.bad_lines, r.truncated) == (4, 3, 1, 0, 1)
    d = load(tmp_path / "out")
    tr, ev = d["train"], d["eval"]
    assert tr["label"].tolist() == [1, 0, 1] and ev["label"].tolist() == [0]
    np.testing.assert_allclose(tr["dense"][:, 0], np.log1p([3, 0, 7]), rtol=1e-6)
    assert tr["sparse"][:, 0].tolist() == [cid("a"), cid("b"), 0]
    assert tr["multi0.offsets"].tolist() == [0, 2, 2, 3]
    assert tr["multi0.values"].tolist() == [cid("a"), cid("b"), cid("c")]  # shared table c
    assert ev["multi0.values"].tolist() == [cid("b"), cid("a")]  # cut to max_len 2
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["source"]["kind"] == "convert" and meta["source"]["truncated_lists"] == 1
    assert meta["preprocessing"]["hash"] == "fnv1a64-splitmix64"
    assert meta["preprocessing"]["schema"]["multi_hot"][0]["separator"] == "|"


def test_standardize_fits_on_train_rows_only(tmp_path):
    sch = '[label]\ncolumn = "y"\n[[dense]]\nname = "x"\ntransform = "standardize"\n' \
          '[[categorical]]\nname = "c"\ncolumn = "x"\n[split]\neval_fraction = 0.5\n'
    r = run(tmp_path, "y,x\n1,1\n0,3\n1,\n0,1000\n1,-1000\n", sch)  # 3 train rows, one empty
    fitted = r.preprocessing["standardize"]["x"]
    assert (fitted["mean"], fitted["std"], fitted["count"]) == (2.0, 1.0, 2)
    d = load(tmp_path / "out")
    assert d["train"]["dense"][:, 0].tolist() == [-1.0, 1.0, 0.0]  # missing -> 0
    assert d["eval"]["dense"][:, 0].tolist() == [998.0, -1002.0]


def test_split_by_column_values_weight_and_threshold(tmp_path):
    sch = 'weight = "w"\n[label]\ncolumn = "r"\nthreshold = 4\n[[categorical]]\nname = "u"\n' \
          '[split]\ncolumn = "day"\nvalues = [3, "x"]\n'
    run(tmp_path, "r,u,w,day\n5,a,1,1\n3,b,0.5,3\n4,c,2,x\n1,d,-1,2\n", sch)
    d = load(tmp_path / "out")
    assert d["train"]["label"].tolist() == [1.0] and d["train"]["weight"].tolist() == [1.0]
    assert d["eval"]["label"].tolist() == [0.0, 1.0] and d["eval"]["weight"].tolist() == [0.5, 2]


def test_eval_files_and_tsv_without_header(tmp_path):
    sch = '[input]\ndelimiter = "\\t"\nheader = false\ncolumns = ["y", "c"]\n' \
          '[label]\ncolumn = "y"\n[[categorical]]\nname = "c"\n[split]\neval_files = ["*valid*"]\n'
    a, b = write(tmp_path / "train.tsv", "1\tq\n0\tr\n"), write(tmp_path / "valid.tsv", "1\tq\n")
    r = convert([a, b], schema(sch), tmp_path / "out", progress=False)
    assert (r.train_rows, r.eval_rows) == (2, 1)


# ------------------------------------------------------------------------------------ bad input

def test_bad_rows_are_skipped_counted_and_located(tmp_path):
    text = HEADER + "1,3,a,a\n0,abc,b,\n1,7,c\n2,1,a,\n,1,a,\n1,inf,a,\n\n0,1,a,a\n"
    r = run(tmp_path, text, SCHEMA.replace("eval_fraction = 0.25", "eval_fraction = 0.0"))
    assert (r.lines, r.rows_written, r.bad_lines) == (8, 2, 6)
    got = [(e.where.split("/")[-1], e.column, e.reason) for e in r.examples]
    assert got == [("in.csv:3", "x", "'abc' is not a number"),
                   ("in.csv:4", "", "expected 4 fields, got 3"),
                   ("in.csv:5", "y", "the label is not 0 or 1 (2)"),
                   ("in.csv:6", "y", "the label is missing"),
                   ("in.csv:7", "x", "inf is not a number"),
                   ("in.csv:8", "y", "the label is missing")]  # a blank line


def test_strict_names_file_line_and_column(tmp_path):
    with pytest.raises(ConvertError, match=r"in.csv:3: column x: 'abc' is not a number "
                                           r"\(--strict\)$"):
        run(tmp_path, HEADER + "1,3,a,a\n0,abc,b,\n", strict=True)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConvertError, match=r"in.csv:5: column m: a list of 3 elements, more "
                                           r"than max_len 2 \(--strict\)$"):
        run(tmp_path, strict=True)
    with pytest.raises(ConvertError, match=r"in.csv:2: expected 4 fields, got 5"):
        run(tmp_path, HEADER + "1,3,a,a,z\n", strict=True)


def test_input_errors_are_one_line(tmp_path):
    with pytest.raises(ConvertError, match=r"in.csv: column 'm' \(multi_hot\[0\].name in the "
                                           r"schema\) is not in its header \(y, x, c\)"):
        run(tmp_path, "y,x,c\n1,2,a\n")
    with pytest.raises(ConvertError, match="in.csv: empty file"):
        run(tmp_path, "")
    with pytest.raises(ConvertError, match="in.csv: empty file"):
        run(tmp_path, "\n\n")
    with pytest.raises(ConvertError, match="not found"):
        run(tmp_path, None, name="missing.csv")
    with pytest.raises(ConvertError, match="no data rows"):
        run(tmp_path, HEADER)
    with pytest.raises(ConvertError, match=r"all 1 rows .* are bad; first: .*in.csv:2: "
                                           r"column y: the label is missing"):
        run(tmp_path, HEADER + ",1,a,\n")
    a = write(tmp_path / "a.csv", HEADER + ROWS)
    b = write(tmp_path / "b.csv", "y,x,m,c\n" + ROWS)
    with pytest.raises(ConvertError, match=r"b.csv:1: the header differs from .*a.csv's: "
                                           r"column 3 is 'm', not 'c'"):
        convert([a, b], schema(), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_error_leaves_the_old_data_set(tmp_path):
    run(tmp_path)
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    with pytest.raises(ConvertError):
        run(tmp_path, HEADER + "1,3,a,a\n0,abc,b,\n", strict=True, overwrite=True)
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        run(tmp_path)
    after = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["in.csv", "out"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out"]
    r = run(tmp_path, HEADER + "1,3,a,a\n", overwrite=True)  # a data set with multi-hot parts
    assert r.rows_written == 1


# -------------------------------------------------------------------- compression and Parquet

@pytest.mark.parametrize("codec, name", [("gzip", "in.csv.gz"), ("zstd", "in.csv.zst"),
                                         ("bz2", "in.csv.bz2")])
def test_compressed_input_gives_the_same_data(tmp_path, codec, name):
    run(tmp_path)
    plain = load(tmp_path / "out")
    with pa.output_stream(str(tmp_path / name), compression=codec) as f:
        f.write((HEADER + ROWS).encode())
    convert([tmp_path / name], schema(), tmp_path / "out2", progress=False, block_bytes=16)
    packed = load(tmp_path / "out2")
    for split in plain:
        for kind in plain[split]:
            assert np.array_equal(plain[split][kind], packed[split][kind])


def test_parquet_input(tmp_path):
    run(tmp_path)
    table = pa.table({"y": [1, 0, 1, 0], "x": [3.0, None, 7.0, 0.0], "c": ["a", "b", None, "a"],
                      "m": ["a|b", None, "c", "b|a|c"]})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=3)
    r = convert([tmp_path / "in.parquet"], schema(), tmp_path / "out2", progress=False)
    assert (r.train_rows, r.eval_rows, r.truncated) == (3, 1, 1)
    a, b = load(tmp_path / "out"), load(tmp_path / "out2")
    for split in a:
        for kind in a[split]:
            assert np.array_equal(a[split][kind], b[split][kind]), (split, kind)
    bad = pa.table({"y": ["1", "0", "x"], "x": ["1", "z", "2"], "c": ["a"] * 3,
                    "m": ["a"] * 3})
    pq.write_table(bad, tmp_path / "bad.parquet", row_group_size=2)
    r = convert([tmp_path / "bad.parquet"], schema(), tmp_path / "out3", progress=False)
    assert [(e.where.split("/")[-1], e.column) for e in r.examples] == [
        ("bad.parquet: row group 0, row 1", "x"), ("bad.parquet: row group 1, row 0", "y")]


# ------------------------------------------------------------------------------------ the CLI

def test_cli_convert(tmp_path):
    src = write(tmp_path / "in.csv", HEADER + "1,3,a,a\n0,abc,b,\n")
    sch = write(tmp_path / "s.toml", SCHEMA)
    res = CliRunner().invoke(main, ["data", "convert", str(src), "--schema", str(sch), "--out",
                                    str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "converted 2 lines of 1 file(s)" in res.output and "1 bad lines skipped" in res.output
    assert "skipped " + str(src) + ":3: column x: 'abc' is not a number" in res.output
    res = CliRunner().invoke(main, ["data", "convert", str(src), "--preset", "nope", "--out",
                                    str(tmp_path / "o")])
    assert res.exit_code == 2 and "unknown preset 'nope'" in res.output
    res = CliRunner().invoke(main, ["data", "convert", str(src), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "one of --schema FILE or --preset NAME" in res.output


# ------------------------------------------------------------------------ real samples, presets

SAMPLES = [("criteo", "criteo_kaggle_train_head1k/train_head1k.txt", 1000, 205),
           ("criteo", "criteo_raw_paddlerec/sample_train.txt", 100, 29),
           ("criteo_csv", "criteo_sample_deepctr/criteo_sample.txt", 200, 49),
           ("avazu", "avazu_head9k/avazu_train_head9k.csv", 8999, 1563),
           ("avazu", "avazu_sample_deepctr/avazu_sample.txt", 100, 20),
           ("movielens", "movielens_sample_deepctr/movielens_sample.txt", 200, 113),
           ("taobao", "taobao_tiny_fuxictr/train_sample.csv taobao_tiny_fuxictr/valid_sample.csv",
            200, 8)]


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared sample data at {SHARED}")
@pytest.mark.parametrize("preset, files, rows, positives", SAMPLES)
def test_samples_convert_with_their_preset(tmp_path, preset, files, rows, positives):
    r = convert([SHARED / f for f in files.split()], load_preset(preset), tmp_path / "out",
                strict=True, progress=False)
    assert (r.lines, r.rows_written, r.bad_lines) == (rows, rows, 0)
    d = load(tmp_path / "out")
    assert sum(v["label"].sum() for v in d.values()) == positives
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    for t, split in ((t, s) for t in meta["tables"] for s in d.values()):
        for j, f in enumerate(f for f in meta["features"] if "pooling" not in f):
            if f["table"] == t["name"]:
                assert 0 <= split["sparse"][:, j].min() and split["sparse"][:, j].max() < t["rows"]
    if preset == "taobao":  # click_sequence shares adgroup_id's table: same value, same id
        assert (r.train_rows, r.eval_rows) == (100, 100)
        assert cid("172298", 1_000_000) in d["train"]["sparse"][:, 0]
    if preset == "movielens":
        assert d["train"]["multi0.offsets"][-1] > 0


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared sample data at {SHARED}")
def test_criteo_test_file_without_labels_is_refused(tmp_path):
    path = SHARED / "criteo_kaggle_test_head10k" / "test_head10k.txt"
    with pytest.raises(ConvertError, match=r"all 10,000 rows .* are bad; first: .*:1: "
                                           r"expected 40 fields, got 39"):
        convert([path], load_preset("criteo"), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the fast path (convert_fast)

FAST_SCHEMA = """
weight = "w"
[label]
column = "y"
[[dense]]
name = "x"
transform = "log1p"
[[dense]]
name = "z"
transform = "standardize"
[[categorical]]
name = "c"
[[categorical]]
name = "d"
[[categorical]]
name = "h"
column = "c"
encoding = "hex32"
[tables.d]
rows = 7
[[multi_hot]]
name = "m"
table = "c"
separator = "|"
max_len = 2
[split]
column = "s"
values = ["e"]
"""
FAST_ROWS = ["1,3,-5,1,a1b2c3d4,q,a|b,t", "0,,12345678,2,,longer than eight,,e",
             "1,7,-0,1,x,é,c|d|e,t", "0,12,3,0,ffffffff,,|,t", "1,1,2,1,a,b,c,t,extra",
             "0,99999999,1,1,abc,defg,x,t", "1,5,1.5,1,a,b,c,t", "1,0,0,1,aaaaaaaa,bbbbbbbb,,t",
             "1,260.0,-0.0,1e2,ABCDEF01,q,a,t", "0,+3,.5,0.5,0x1,q,a,t", "1,1e999,1,1,a,b,c,t",
             "0,123456789012,7.,2E-1,a1b2c3d4,d,e,t"]
ODD_ROWS = ["1, 5,1,1,a,b,c,t", "0,nan,1,1,a,b,c,t", "1,1,1,x,a,b,c,t"]  # the CSV reader's


@pytest.mark.parametrize("lines", [FAST_ROWS, FAST_ROWS[:2] + FAST_ROWS[3:6] + FAST_ROWS[7:],
                                   FAST_ROWS + [""] + FAST_ROWS[:1], FAST_ROWS[:1] * 3,
                                   FAST_ROWS + ODD_ROWS + FAST_ROWS])
@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_fast_path_writes_what_the_csv_reader_path_writes(tmp_path, monkeypatch, lines, end):
    import recsync.data.convert as conv
    text = "y,x,z,w,c,d,m,s" + end + end.join(lines) + end
    outs = []
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(conv, "fast_block", lambda *a: None)
        out = tmp_path / f"out{fast}"
        r = convert([write(tmp_path / "in.csv", text)], schema(FAST_SCHEMA), out,
                    progress=False, block_bytes=64)
        files = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
                 if p.is_file() and p.name != "meta.json"}
        meta = json.loads((out / "meta.json").read_text())
        outs.append((files, meta["source"], meta["preprocessing"]["standardize"],
                     [(e.where.split("/")[-1], e.column, e.reason) for e in r.examples]))
    assert outs[0] == outs[1]


def test_fast_path_decodes_odd_numbers_field_by_field():
    """A few decimals, exponents or long numbers in a block do not send the whole block to the
    CSV reader: they are decoded one by one, as it would; a value that is no number does."""
    from recsync.data.convert_fast import fast_block
    from recsync.data.convert_parse import Plan
    plan = Plan.of(schema('[label]\ncolumn = "y"\n[[dense]]\nname = "x"\n'
                          '[[categorical]]\nname = "c"\nencoding = "hex32"\n'))
    rows = ["1,260.0,a", "0,-0,b", "1,1e999,c", "0,123456789012,d", "1,2.5,0000000f", "0,7,e"]
    block = fast_block(("\n".join(rows) + "\n").encode(), ["y", "x", "c"], plan, ",")
    values, present, bad = block.numbers("x")
    assert values.tolist() == [260.0, 0.0, 0.0, 123456789012.0, 2.5, 7.0]
    assert np.signbit(values[1]) and bad.tolist() == [False, False, True, False, False, False]
    assert fast_block(b"1, 5\t,a\n", ["y", "x", "c"], plan, ",").numbers("x")[0] == [5.0]
    assert fast_block(b"1,5x,a\n", ["y", "x", "c"], plan, ",") is None
    assert fast_block(b"1,nan,a\n", ["y", "x", "c"], plan, ",") is None
