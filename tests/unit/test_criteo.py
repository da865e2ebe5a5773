"""Criteo text on the one conversion path (`recsync data criteo`: presets criteo and criteo_csv of
`recsync data convert`): values and ids held to the reference parser (criteo_oracle.py), the
Criteo flags, layouts, compression, real samples, and the benchmarks' TSV writer."""

from __future__ import annotations

import json
import lzma
import math
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from criteo_oracle import CSV_HEADER, category_id, read_splits, reference_file
from recsync.bench.criteo_file import write_criteo_tsv
from recsync.cli import main
from recsync.data.convert_input import ConvertError
from recsync.data.criteo import convert_criteo, criteo_preset
from recsync.data.schema import SchemaError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
MISSING_INT = np.iinfo(np.int64).min


def line(label="0", ints=None, cats=None, sep="\t") -> str:
    ints = ["1"] * 13 if ints is None else [str(x) for x in ints]
    cats = ["0000000a"] * 26 if cats is None else cats
    assert len(ints) == 13 and len(cats) == 26
    return sep.join([str(label), *ints, *cats])


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def convert(paths, out, *, overrides=None, eval_fraction=0.0, **kw):
    """What `recsync data criteo` runs (no eval rows unless asked)."""
    return convert_criteo(paths, out, table_size_overrides=overrides, progress=False,
                          eval_fraction=eval_fraction, **kw)


def load_all(out: Path):
    s = read_splits(out)
    return tuple(np.concatenate([s["train"][i], s["eval"][i]]) for i in range(3))


def assert_as_reference(path: Path, out: Path, table_size: int, eval_fraction: float = 0.0):
    """The conversion of ``path`` equals the reference parser's, row for row."""
    train, held, bad = reference_file(path.read_bytes(), table_size, eval_fraction)
    got = read_splits(out)
    for split, want in (("train", train), ("eval", held)):
        assert got[split][2].tolist() == want[2].tolist(), split
        assert (got[split][1] == want[1]).all(), split
        np.testing.assert_array_equal(got[split][0], want[0], err_msg=split)
    return bad


def test_tsv_round_trip_values(tmp_path):
    ints = [0, 1, "", 5, -1, 1382, "", 15, 2, 181, 1, 2, 99999999]
    cats = ["68fd1e64", "", "FB936136", *["7b4723c4"] * 22, ""]
    p = write(tmp_path / "a.txt", line(1, ints, cats) + "\n" + line(0) + "\n")
    rep = convert(p, tmp_path / "out", table_size=1000)
    assert (rep.lines, rep.rows_written, rep.bad_lines, rep.examples) == (2, 2, 0, [])
    dense, sparse, label = load_all(tmp_path / "out")
    assert label.tolist() == [1.0, 0.0] and dense.dtype == np.float32 and sparse.dtype == np.int32
    expect = [0 if x in ("", -1) else math.log1p(x) for x in ints]  # missing and max(-1,0) -> 0
    assert dense[0].tolist() == np.float32(expect).tolist()  # log1p in float64, rounded once
    assert sparse[0, 1] == 0 and sparse[0, 25] == 0  # missing categories -> reserved id 0
    assert sparse[0, 0] == category_id(b"68fd1e64", 1000)
    assert sparse[0, 2] == category_id(b"fb936136", 1000) == category_id(b"FB936136", 1000)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert [t["rows"] for t in meta["tables"]] == [1000] * 26
    assert {c["encoding"] for c in meta["preprocessing"]["schema"]["categorical"]} == {"hex32"}
    assert meta["preprocessing"]["log1p"] == "float64" and meta["source"]["kind"] == "convert"
    assert assert_as_reference(p, tmp_path / "out", 1000) == 0


def test_pinned_ids_never_change():
    """The ids on disk must not change silently between versions (here, and in every data set
    `recsync data criteo` ever wrote: tests/unit/test_criteo_fixture.py)."""
    assert category_id(b"00000000", 2**31 - 1) == 1 + 0xE220A8397B1DCDAF % (2**31 - 2)
    ids = [category_id(f"{v:08x}".encode(), 101) for v in range(20_000)]  # consecutive inputs
    counts = np.bincount(ids, minlength=101)[1:]
    assert counts.min() > 130 and counts.max() < 270  # ~198 each


def test_deepctr_csv_layout_is_detected(tmp_path):
    ints = ["", "3", "260.0", "", "17668.0", "-1.0", "-1", "33.0", "7.000", "", "", "0.0", "2.5"]
    p = write(tmp_path / "s.csv", CSV_HEADER.decode() + "\n" + line("1.0", ints, sep=",") + "\n"
              + line("0", sep=",") + "\n" + line("x", sep=",") + "\n")
    assert criteo_preset([p]) == "criteo_csv"
    rep = convert(p, tmp_path / "out", table_size=50)
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (3, 2, 1)
    assert (rep.examples[0].where, rep.examples[0].column) == (f"{p}:4", "label")
    dense = load_all(tmp_path / "out")[0]
    expect = [0, 3, 260, 0, 17668, 0, 0, 33, 7, 0, 0, 0, 2.5]
    assert dense[0].tolist() == np.float32(np.log1p(expect)).tolist()
    assert_as_reference(p, tmp_path / "out", 50)


def test_a_tsv_and_a_csv_together_are_refused(tmp_path):
    a = write(tmp_path / "a.txt", line() + "\n")
    b = write(tmp_path / "b.csv", CSV_HEADER.decode() + "\n" + line(sep=",") + "\n")
    with pytest.raises(ConvertError, match=r"b\.csv: DeepCTR's Criteo CSV, but .*a\.txt is raw"):
        convert([a, b], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_category_that_is_not_8_hex_digits_hashes_as_text(tmp_path):
    odd = ["68fd1e6g", "0x12abcd", "68fd1e6", "68fd1e64a", "-1", "68fd 1e6", "000000é", "zz"]
    lines = [line(cats=["0000000a", v] + ["0000000a"] * 24) for v in odd]
    p = write(tmp_path / "a.txt", "\n".join(lines) + "\n")
    rep = convert(p, tmp_path / "out", table_size=97)
    assert (rep.rows_written, rep.bad_lines) == (len(odd), 0)  # a category is never bad
    assert load_all(tmp_path / "out")[1][:, 1].tolist() == [category_id(v.encode(), 97)
                                                           for v in odd]


@pytest.mark.parametrize("value, good", [
    ("2.5", True), ("+3", True), ("1e5", True), (" 1", True), ("5.", True), (".5", True),
    ("-0", True), ("007", True), ("123456789012", True), ("1" + "0" * 300, True),
    ("nan", False), ("inf", False), ("0x1f", False), ("--1", False), ("1e999", False),
    ("12a", False), ("1:", False), ("-", False), (" ", False), ("1" + "0" * 400, False)])
def test_dense_numbers_as_the_csv_reader_reads_them(tmp_path, value, good):
    p = write(tmp_path / "a.txt", "\n".join([line(), line(ints=["1", "2", value] + ["1"] * 10),
                                            line()]) + "\n")
    rep = convert(p, tmp_path / "out")
    assert rep.bad_lines == (0 if good else 1)
    if not good:
        assert (rep.examples[0].where, rep.examples[0].column) == (f"{p}:2", "I3")
    assert_as_reference(p, tmp_path / "out", 1_000_000)


def test_every_byte_lane_of_the_fast_paths(tmp_path):
    """Each lane of the 8-byte decoders: valid characters decode, their neighbours do not."""
    numbers, hexes = [], []
    for n in range(1, 9):
        for pos in range(n):
            digits = "".join(str((pos + k) % 10) for k in range(n))
            signed = ["-" + digits] if n < 8 else []
            for v in [digits, *signed] + ([digits + ".0"] if n < 7 else []):
                at = pos + v.startswith("-")
                numbers += [v] + [v[:at] + c + v[at + 1:] for c in "/:"]
    for pos in range(8):
        hexes += ["5" * pos + c + "a" * (7 - pos) for c in "0123456789abcdefABCDEF/:@G`g \x7f"]
    lines = [line(ints=[v] + ["1"] * 12) for v in numbers] + [line(cats=[v] * 26) for v in hexes]
    p = write(tmp_path / "a.txt", "\n".join(lines) + "\n")
    convert(p, tmp_path / "out", table_size=2**31 - 1)
    assert assert_as_reference(p, tmp_path / "out", 2**31 - 1) > 0


JUNK = ["", "0", "1", "-1", "2.5", "abc", "12345678", "123456789", "-", "-0", "0x12", "ABCDEF12",
        "abcdefgh", "\r", "1.0", " 1", "1 ", "fffffffff", "5.", "\x00", "é", "0000000g", "1e5",
        "+3", ".0", "--1", "GGGGGGGG", "1.0.0", "00.0", "1:", "/1", "nan", "inf", "1e400"]


def random_lines(rng: random.Random, n: int, sep: str) -> list[str]:
    out = []
    for _ in range(n):
        fields = [rng.choice("01")]
        fields += [rng.choice(["", str(rng.randrange(-3, 10 ** rng.randrange(1, 9)))])
                   for _ in range(13)]
        fields += [rng.choice(["", f"{rng.getrandbits(32):08x}"]) for _ in range(26)]
        r = rng.random()
        if r < 0.3:  # corrupt one field
            fields[rng.randrange(40)] = rng.choice(JUNK)
        elif r < 0.35:
            del fields[rng.randrange(40)]
        elif r < 0.4:
            fields.insert(rng.randrange(40), rng.choice(JUNK))
        out.append(sep.join(fields) + ("\r" if rng.random() < 0.1 else ""))
    return out


@pytest.mark.parametrize("block", [64, 1000, 1 << 20])
@pytest.mark.parametrize("csv", [False, True])
def test_the_converter_agrees_with_the_reference_parser(tmp_path, block, csv):
    lines = random_lines(random.Random(block * 2 + csv), 600, "," if csv else "\t")
    head = CSV_HEADER.decode() + "\n" if csv else ""
    p = write(tmp_path / "f.txt", (head + "\n".join(lines)).encode())  # last line unterminated
    rep = convert(p, tmp_path / "out", table_size=777, block_bytes=block, eval_fraction=0.1)
    bad = assert_as_reference(p, tmp_path / "out", 777, 0.1)
    assert 0 < bad == rep.bad_lines < rep.lines


def test_table_sizes_and_overrides(tmp_path):
    vals = [f"{v:08x}" for v in range(26)]
    p = write(tmp_path / "a.txt", "\n".join(line(cats=vals) for _ in range(3)) + "\n")
    convert(p, tmp_path / "out", table_size=1000, overrides={"C1": 2, "C26": 5})
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    rows = [t["rows"] for t in meta["tables"]]
    assert rows == [2] + [1000] * 24 + [5]
    sparse = load_all(tmp_path / "out")[1]
    assert (sparse[:, 0] == 1).all()  # a 2-row table: one id for all present values
    assert sparse[0].tolist() == [category_id(v.encode(), r) for v, r in zip(vals, rows)]
    for bad, match in (({"C27": 10}, "C27"), ({"c1": 10}, "c1"), ({"C3": 1}, "C3"),
                       ({}, "table_rows")):
        with pytest.raises(SchemaError, match=match):
            convert(p, tmp_path / "o2", overrides=bad, table_size=1000 if bad else 1)
    assert not (tmp_path / "o2").exists()


def test_the_cli_alias_and_its_flags(tmp_path):
    a = write(tmp_path / "a.txt", "\n".join(line(ints=[i] * 13) for i in range(60)) + "\n")
    b = write(tmp_path / "b.txt", "\n".join(line(ints=[i] * 13) for i in range(60, 99))
              + "\nbad\n")
    r = CliRunner().invoke(main, ["data", "criteo", str(a), str(b), "--out", str(tmp_path / "o"),
                                  "--table-size", "50", "--table-size", "C3=7",
                                  "--eval-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    assert "75 train + 24 eval rows" in r.output and "1 bad lines skipped" in r.output
    assert f"skipped {b}:40: expected 40 fields, got 1" in r.output
    s = read_splits(tmp_path / "o")  # the LAST lines (time order, files in order) are eval
    assert s["eval"][0][:, 0].tolist() == np.float32(np.log1p(np.arange(75, 99))).tolist()
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert [t["rows"] for t in meta["tables"]][:4] == [50, 50, 7, 50]
    for flags in (["--eval-fraction", "1"], ["--table-size", "C30=5"], ["--table-size", "x"]):
        r = CliRunner().invoke(main, ["data", "criteo", str(a), "--out", str(tmp_path / "p"),
                                      *flags])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert not (tmp_path / "p").exists()


def test_xz_is_read_and_zip_refused(tmp_path):
    text = "\n".join(line(ints=[i] * 13) for i in range(20)) + "\n"
    plain = write(tmp_path / "a.txt", text)
    packed = write(tmp_path / "a.xz", lzma.compress(text.encode()))
    convert(plain, tmp_path / "p")
    convert(packed, tmp_path / "x")
    assert all((a == b).all() for a, b in zip(load_all(tmp_path / "p"), load_all(tmp_path / "x")))
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr("a.txt", text)
    with pytest.raises(ConvertError, match=r"a\.zip: a zip archive; unzip it first"):
        convert(tmp_path / "a.zip", tmp_path / "z")


def test_write_criteo_tsv_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    n = 3000
    labels = rng.integers(0, 2, n)
    ints = rng.integers(-5, 10**7, size=(n, 13))
    ints[rng.random((n, 13)) < 0.1] = MISSING_INT
    ints[0, :6] = [np.iinfo(np.int64).max, -(10**18), 0, -1, 10**12, MISSING_INT]
    cats = rng.integers(0, 2**32, size=(n, 26))
    cats[rng.random((n, 26)) < 0.05] = -1
    cats[0, :4] = [0, 0xFFFFFFFF, 0xA, -1]
    p = tmp_path / "w.txt"
    write_criteo_tsv(p, labels, ints, cats)
    text = p.read_text()
    assert text.count("\n") == n and text.endswith("\n")
    first = text.split("\n", 1)[0].split("\t")
    assert first[1:7] == [str(np.iinfo(np.int64).max), str(-(10**18)), "0", "-1", str(10**12), ""]
    assert first[14:18] == ["00000000", "ffffffff", "0000000a", ""]
    rep = convert(p, tmp_path / "out", table_size=5000)
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (n, n, 0)
    assert load_all(tmp_path / "out")[2].tolist() == labels.tolist()
    assert_as_reference(p, tmp_path / "out", 5000)


def test_write_criteo_tsv_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="shapes"):
        write_criteo_tsv(tmp_path / "x", np.zeros(2, int), np.zeros((2, 12), int),
                         np.zeros((2, 26), int))
    with pytest.raises(ValueError, match="cats"):
        write_criteo_tsv(tmp_path / "x", np.zeros(1, int), np.zeros((1, 13), int),
                         np.full((1, 26), 2**32))


@pytest.mark.parametrize("name, lines, positives", [
    ("criteo_kaggle_train_head1k/train_head1k.txt", 1000, 205),
    ("criteo_sample_deepctr/criteo_sample.txt", 200, 49),
    ("criteo_raw_paddlerec/sample_train.txt", 100, 29)])  # no final newline
def test_real_samples(tmp_path, name, lines, positives):
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    rep = convert(path, tmp_path / "k", eval_fraction=0.1)
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (lines, lines, 0)
    assert (rep.train_rows, rep.eval_rows) == (lines * 9 // 10, lines // 10)
    assert int(load_all(tmp_path / "k")[2].sum()) == positives  # per the sample's README
    assert_as_reference(path, tmp_path / "k", 1_000_000, 0.1)
