"""Criteo text -> binary conversion: field rules, bad lines, splits, layouts, real samples."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from recsync.data import criteo
from recsync.data.criteo import BadLine, ConversionReport, convert_criteo
from recsync.data.criteo_rules import CSV_HEADER, CriteoFormatError, hash_category, parse_line
from recsync.data.criteo_writer import write_criteo_tsv
from recsync.data.format import MAX_INT32_ROWS as MAX_TABLE_ROWS
from recsync.data.format import part_paths

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
MISSING_INT = np.iinfo(np.int64).min


# ------------------------------------------------------------------------------------ helpers

def line(label="0", ints=None, cats=None, sep="\t") -> str:
    ints = ["1"] * 13 if ints is None else [str(x) for x in ints]
    cats = ["0000000a"] * 26 if cats is None else cats
    assert len(ints) == 13 and len(cats) == 26
    return sep.join([str(label), *ints, *cats])


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def load(out: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{split: (dense, sparse, label)} read back through meta.json's part list."""
    meta = json.loads((out / "meta.json").read_text())
    res = {}
    for split, info in meta["splits"].items():
        arrays = {"dense": [], "sparse": [], "label": []}
        for part in info["parts"]:
            for kind, p in part_paths(out / split, part["name"]).items():
                arrays[kind].append(np.load(p, allow_pickle=False))
        res[split] = (
            np.concatenate(arrays["dense"]) if arrays["dense"] else np.zeros((0, 13), np.float32),
            np.concatenate(arrays["sparse"]) if arrays["sparse"] else np.zeros((0, 26), np.int32),
            np.concatenate(arrays["label"]) if arrays["label"] else np.zeros(0, np.float32))
        assert len(res[split][0]) == info["rows"]
    return res


def load_all(out: Path):
    s = load(out)
    return tuple(np.concatenate([s["train"][i], s["eval"][i]]) for i in range(3))


def convert(paths, out, **kw) -> ConversionReport:
    kw.setdefault("progress", False)
    kw.setdefault("eval_fraction", 0.0)
    return convert_criteo(paths if isinstance(paths, list) else [paths], out, **kw)


def splitmix64_py(v: int) -> int:
    m = (1 << 64) - 1
    z = (v + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def reference_rows(lines: list[bytes], csv: bool, rows: int):
    """Expected (dense, sparse, label) of the good lines and the count of bad ones."""
    dense, sparse, labels, bad = [], [], [], 0
    for ln in lines:
        try:
            lab, d, c = parse_line(ln, csv)
        except CriteoFormatError:
            bad += 1
            continue
        labels.append(lab)
        dense.append(d)
        sparse.append([0 if v is None else 1 + splitmix64_py(v) % (rows - 1) for v in c])
    return (np.array(dense, np.float32).reshape(-1, 13), np.array(sparse, np.int64).reshape(-1, 26),
            np.array(labels, np.float32), bad)


# ------------------------------------------------------------------------------------ hashing

def test_hash_category_matches_splitmix64_and_range():
    vals = np.array([0, 1, 0xDEADBEEF, 0xFFFFFFFF, 12345], dtype=np.uint32)
    for rows in (2, 3, 1000, MAX_TABLE_ROWS):
        ids = hash_category(vals, rows)
        assert ids.dtype == np.int64
        assert ids.tolist() == [1 + splitmix64_py(int(v)) % (rows - 1) for v in vals]
        assert ((ids >= 1) & (ids < rows)).all()
    assert (hash_category(vals, 2) == 1).all()
    # pinned value: the on-disk ids must not change silently between versions
    assert splitmix64_py(0) == 0xE220A8397B1DCDAF
    assert int(hash_category(np.array([0], np.uint32), 2**31 - 1)[0]) == \
        1 + 0xE220A8397B1DCDAF % (2**31 - 2)


def test_hash_category_mixes_well():
    ids = hash_category(np.arange(100_000, dtype=np.uint32), 101)  # consecutive inputs
    counts = np.bincount(ids, minlength=101)[1:]
    assert counts.min() > 800 and counts.max() < 1200  # ~1000 each


def test_hash_category_rejects_bad_rows_and_values():
    with pytest.raises(ValueError, match="rows"):
        hash_category(np.array([1], np.uint32), 1)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        hash_category(np.array([-1]), 10)


# ------------------------------------------------------------------------------------ field rules

def test_tsv_round_trip_values(tmp_path):
    ints = [0, 1, "", 5, -1, 1382, "", 15, 2, 181, 1, 2, 99999999]
    cats = ["68fd1e64", "", "FB936136", *["7b4723c4"] * 22, ""]
    p = write(tmp_path / "a.txt", line(1, ints, cats) + "\n" + line(0) + "\n")
    rep = convert(p, tmp_path / "out", table_size=1000)
    assert (rep.lines, rep.rows_written, rep.bad_lines, rep.examples) == (2, 2, 0, [])
    dense, sparse, label = load_all(tmp_path / "out")
    assert label.tolist() == [1.0, 0.0]
    assert dense.dtype == np.float32 and sparse.dtype == np.int32
    expect = [0 if x in ("", -1) else math.log1p(x) for x in ints]  # missing and max(-1,0) -> 0
    np.testing.assert_allclose(dense[0], np.float32(expect), rtol=1e-6)
    assert dense[0, 2] == 0 and dense[0, 4] == 0
    assert sparse[0, 1] == 0 and sparse[0, 25] == 0  # missing categories -> reserved id 0
    assert sparse[0, 0] == hash_category(np.array([0x68FD1E64], np.uint32), 1000)[0]
    assert sparse[0, 2] == hash_category(np.array([0xFB936136], np.uint32), 1000)[0]  # upper case
    assert sparse[0, 3] == hash_category(np.array([0x7B4723C4], np.uint32), 1000)[0]
    np.testing.assert_allclose(dense[1], np.full(13, math.log(2), np.float32), rtol=1e-6)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert [t["rows"] for t in meta["tables"]] == [1000] * 26
    assert meta["source"]["kind"] == "criteo" and meta["source"]["lines"] == 2
    assert meta["source"]["bad_lines"] == 0 and meta["synthetic"] is None


def test_deepctr_csv_layout(tmp_path):
    header = ",".join(["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]])
    ints = ["", "3", "260.0", "", "17668.0", "-1.0", "-1", "33.0", "7.000", "", "", "0.0", ""]
    p = write(tmp_path / "s.csv", header + "\n" + line("1.0", ints, sep=",") + "\n"
              + line("0", sep=",") + "\n" + line("0", ["2.5"] + ["1"] * 12, sep=",") + "\n")
    rep = convert(p, tmp_path / "out", table_size=50)
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (3, 2, 1)
    assert rep.examples == [BadLine(str(p), 4, "non-integer dense value in I1: '2.5'")]
    dense, sparse, label = load_all(tmp_path / "out")
    assert label.tolist() == [1.0, 0.0]
    expect = [0, 3, 260, 0, 17668, 0, 0, 33, 7, 0, 0, 0, 0]
    np.testing.assert_allclose(dense[0], np.log1p(np.float32(expect)), rtol=1e-6)
    assert (sparse == hash_category(np.array([10], np.uint32), 50)[0]).all()


def test_csv_with_wrong_header_is_rejected(tmp_path):
    p = write(tmp_path / "s.csv", "label,I1,I2\n" + line(sep=",") + "\n")
    with pytest.raises(CriteoFormatError, match=r"s\.csv:1: a CSV header"):
        convert(p, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_label_rules(tmp_path):
    lines = [line("1"), line("0"), line("2"), line("0.0"), line(""), line("01")]
    p = write(tmp_path / "a.txt", "\n".join(lines) + "\n")
    rep = convert(p, tmp_path / "out")
    assert rep.bad_lines == 4  # "1.0"-style labels are a CSV-only convenience
    assert [e.line for e in rep.examples] == [3, 4, 5, 6]
    assert rep.examples[0].reason == "bad label '2' (expected 0 or 1)"
    assert load_all(tmp_path / "out")[2].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("value, expect", [
    ("-1", 0.0), ("-12345", 0.0), ("-0", 0.0), ("0", 0.0), ("007", math.log1p(7)),
    ("12345678", math.log1p(12345678)), ("123456789", math.log1p(123456789)),
    ("-123456789012", 0.0), ("5.0", math.log1p(5)), ("5.00", math.log1p(5)),
    ("1234567.0", math.log1p(1234567)), ("-7.0", 0.0),
    ("1234567890123456789012345", math.log1p(1234567890123456789012345)),  # > int64
    ("1" + "0" * 399, 399 * math.log(10)),  # > float64: still a finite, exact log
])
def test_dense_integer_values(tmp_path, value, expect):
    p = write(tmp_path / "a.txt", line(ints=[value] + ["1"] * 12) + "\n")
    rep = convert(p, tmp_path / "out")
    assert rep.bad_lines == 0
    got = load_all(tmp_path / "out")[0][0, 0]
    assert np.isfinite(got)
    assert got == pytest.approx(expect, rel=1e-6)


@pytest.mark.parametrize("value", ["2.5", "1.01", "5.", ".5", "-", "+3", "1e5", "0x1f", " 1",
                                   "1 ", "--1", "1-", "12a", "nan", "inf", "12345678.5", "1:",
                                   "1234567:", "/1", "12/4", "1.:", "1./", "1:0", "-1:",
                                   ":1234567", "1234:678", "/1234567", "1234567890123.5"])
def test_non_integer_dense_is_bad(tmp_path, value):
    good = line()
    p = write(tmp_path / "a.txt", "\n".join([good, line(ints=["1", "2", value] + ["1"] * 10),
                                            good]) + "\n")
    rep = convert(p, tmp_path / "out")
    assert (rep.rows_written, rep.bad_lines) == (2, 1)
    assert rep.examples[0].line == 2
    assert rep.examples[0].reason.startswith("non-integer dense value in I3: ")


def test_every_character_position_of_the_fast_paths(tmp_path):
    """Each byte lane of the 8-byte fast paths: valid characters decode, neighbours are bad."""
    good, bad = [], []
    for n in range(1, 9):
        for pos in range(n):
            digits = "".join(str((pos + k) % 10) for k in range(n))
            variants = [digits] + (["-" + digits] if n < 8 else []) + \
                       ([digits + ".0"] if n < 7 else [])
            for v in variants:
                good.append(v)
                for c in "/:":
                    bad.append(v[:pos + v.startswith("-")] + c + v[pos + 1 + v.startswith("-"):])
    lines = [line(ints=[v] + ["1"] * 12) for v in good + bad]
    hexgood, hexbad = [], []
    for pos in range(8):
        for c in "0123456789abcdefABCDEF":
            hexgood.append("5" * pos + c + "a" * (7 - pos))
        for c in "/:@G`g \x7f":
            hexbad.append("5" * pos + c + "a" * (7 - pos))
    lines += [line(cats=[v] * 26) for v in hexgood + hexbad]
    p = write(tmp_path / "a.txt", "\n".join(lines) + "\n")
    rep = convert(p, tmp_path / "out", table_size=2**31 - 1)
    assert rep.bad_lines == len(bad) + len(hexbad)
    dense, sparse, _ = load_all(tmp_path / "out")
    expect = [0.0 if v.startswith("-") else math.log1p(int(v.split(".")[0])) for v in good]
    np.testing.assert_allclose(dense[:len(good), 0], np.float32(expect), rtol=1e-6)
    hv = np.array([int(v, 16) for v in hexgood], np.uint32)
    assert (sparse[len(good):, 0] == hash_category(hv, 2**31 - 1)).all()


@pytest.mark.parametrize("value, reason", [
    ("68fd1e6g", "non-hex categorical value in C2: '68fd1e6g'"),
    ("0x12abcd", "non-hex categorical value in C2: '0x12abcd'"),
    ("68fd1e6", "categorical value in C2 has 7 characters, expected 8 hex digits or empty: "
                "'68fd1e6'"),
    ("68fd1e64a", "categorical value in C2 has 9 characters, expected 8 hex digits or empty: "
                  "'68fd1e64a'"),
    ("-1", "categorical value in C2 has 2 characters, expected 8 hex digits or empty: '-1'"),
    ("68fd 1e6", "non-hex categorical value in C2: '68fd 1e6'"),
    ("0000000:", "non-hex categorical value in C2: '0000000:'"),
    ("/0000000", "non-hex categorical value in C2: '/0000000'"),
    ("000g0000", "non-hex categorical value in C2: '000g0000'"),
    ("0000`000", "non-hex categorical value in C2: '0000`000'"),
    ("00G00000", "non-hex categorical value in C2: '00G00000'"),
    ("0@000000", "non-hex categorical value in C2: '0@000000'"),
    ("000000é", "non-hex categorical value in C2: '000000é'"),  # 8 bytes in UTF-8, high bit set
])
def test_bad_categorical_values(tmp_path, value, reason):
    cats = ["0000000a", value] + ["0000000a"] * 24
    p = write(tmp_path / "a.txt", line() + "\n" + line(cats=cats) + "\n")
    rep = convert(p, tmp_path / "out")
    assert (rep.rows_written, rep.bad_lines) == (1, 1)
    assert rep.examples == [BadLine(str(p), 2, reason)]


def test_wrong_field_count_and_empty_lines(tmp_path):
    lines = [line(), line() + "\t", "\t".join(line().split("\t")[:39]), "", line(), "x",
             line().replace("\t", "\x00", 1), line().replace("\t", " ", 1)]  # no tab: not split
    p = write(tmp_path / "a.txt", "\n".join(lines) + "\n")
    rep = convert(p, tmp_path / "out")
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (8, 2, 6)
    assert [(e.line, e.reason) for e in rep.examples] == [
        (2, "expected 40 fields, got 41"), (3, "expected 40 fields, got 39"),
        (4, "expected 40 fields, got an empty line"), (6, "expected 40 fields, got 1"),
        (7, "expected 40 fields, got 39"), (8, "expected 40 fields, got 39")]


def test_crlf_line_endings(tmp_path):
    cats = ["0000000a"] * 25 + ["ABCDEF01"]
    p = write(tmp_path / "a.txt", line(1, cats=cats) + "\r\n" + line(0, ints=[3] * 13) + "\r\n")
    rep = convert(p, tmp_path / "out", table_size=97)
    assert (rep.rows_written, rep.bad_lines) == (2, 0)
    dense, sparse, label = load_all(tmp_path / "out")
    assert sparse[0, 25] == hash_category(np.array([0xABCDEF01], np.uint32), 97)[0]
    assert dense[1, 12] == np.float32(math.log1p(3))
    # an empty last field before the \r
    p2 = write(tmp_path / "b.txt", line(cats=["0000000a"] * 25 + [""]) + "\r\n")
    convert(p2, tmp_path / "out2")
    assert load_all(tmp_path / "out2")[1][0, 25] == 0


def test_truncated_last_line(tmp_path):
    p = write(tmp_path / "a.txt", line(1) + "\n" + line(0, ints=[7] * 13))  # no trailing newline
    rep = convert(p, tmp_path / "out")
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (2, 2, 0)
    assert load_all(tmp_path / "out")[0][1, 0] == np.float32(math.log1p(7))

    cut = line(0)[:100]  # a half-written last line
    p = write(tmp_path / "b.txt", line(1) + "\n" + line(1) + "\n" + cut)
    rep = convert(p, tmp_path / "out2")
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (3, 2, 1)
    assert rep.examples[0].line == 3
    assert rep.examples[0].reason.startswith("expected 40 fields, got ")


def test_trailing_blank_line_skipped_but_inner_blank_is_bad(tmp_path):
    p = write(tmp_path / "a.txt", line() + "\n" + line() + "\n\n")
    rep = convert(p, tmp_path / "out")
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (2, 2, 0)
    p = write(tmp_path / "b.txt", line() + "\r\n\r\n")
    assert convert(p, tmp_path / "out2").lines == 1
    p = write(tmp_path / "c.txt", line() + "\n\n" + line() + "\n")
    rep = convert(p, tmp_path / "out3")
    assert (rep.lines, rep.bad_lines, rep.examples[0].line) == (3, 1, 2)


# ------------------------------------------------------------------------------------ bad lines

def test_default_mode_counts_and_reports_first_ten(tmp_path, monkeypatch):
    monkeypatch.setattr(criteo, "BLOCK_BYTES", 1000)  # many blocks: line numbers across blocks
    lines, bad_at = [], []
    for i in range(1, 101):
        if i % 7 == 0:
            lines.append(line(ints=["x"] + ["1"] * 12))
            bad_at.append(i)
        else:
            lines.append(line(i % 2, ints=[i] * 13))
    a = write(tmp_path / "a.txt", "\n".join(lines) + "\n")
    b = write(tmp_path / "b.txt", line() + "\n" + line(cats=["zz"] * 26) + "\n")
    rep = convert([a, b], tmp_path / "out")
    assert rep.lines == 102
    assert rep.bad_lines == len(bad_at) + 1 == 15
    assert rep.rows_written == 102 - 15
    assert len(rep.examples) == 10
    assert [(e.path, e.line) for e in rep.examples] == [(str(a), i) for i in bad_at[:10]]
    assert all(e.reason == "non-integer dense value in I1: 'x'" for e in rep.examples)
    dense, _, label = load_all(tmp_path / "out")
    good = [i for i in range(1, 101) if i % 7]
    np.testing.assert_allclose(dense[:len(good), 5], np.log1p(np.float32(good)), rtol=1e-6)
    assert label[:len(good)].tolist() == [i % 2 for i in good]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["source"]["bad_lines"] == 15
    assert meta["source"]["bad_line_examples"][0] == {
        "path": str(a), "line": 7, "reason": "non-integer dense value in I1: 'x'"}
    assert meta["source"]["files"] == [str(a), str(b)]

    # a bad line in the second file is numbered within that file
    a2 = write(tmp_path / "a2.txt", line() + "\n")
    rep = convert([a2, b], tmp_path / "out2")
    assert rep.examples == [BadLine(str(b), 2, "categorical value in C1 has 2 characters, "
                                               "expected 8 hex digits or empty: 'zz'")]


def test_strict_mode_raises_with_file_and_line(tmp_path):
    p = write(tmp_path / "x.txt", "\n".join([line()] * 16 + ["\t".join(["1"] * 39)]) + "\n")
    with pytest.raises(CriteoFormatError) as e:
        convert(p, tmp_path / "out", strict=True)
    assert str(e.value) == f"{p}:17: expected 40 fields, got 39"
    assert not (tmp_path / "out" / "meta.json").exists()
    assert convert(p, tmp_path / "out2", strict=False).bad_lines == 1


def test_all_lines_bad_is_an_error(tmp_path):
    p = write(tmp_path / "a.txt", "a\nb\n")
    with pytest.raises(CriteoFormatError, match="all 2 lines"):
        convert(p, tmp_path / "out")
    assert not (tmp_path / "out" / "meta.json").exists()


# ------------------------------------------------------------------------------------ inputs

def test_empty_input_file(tmp_path):
    p = write(tmp_path / "empty.txt", "")
    with pytest.raises(CriteoFormatError, match="empty.txt"):
        convert(p, tmp_path / "out")
    header = write(tmp_path / "h.csv", CSV_HEADER + b"\n")
    with pytest.raises(CriteoFormatError, match="h.csv"):
        convert([p, header], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # an empty file among non-empty ones is fine
    good = write(tmp_path / "g.txt", line() + "\n")
    assert convert([p, good], tmp_path / "out").rows_written == 1


def test_missing_file_named_and_nothing_written(tmp_path):
    good = write(tmp_path / "g.txt", line() + "\n")
    gone = tmp_path / "nope" / "missing.txt"
    with pytest.raises(CriteoFormatError, match="missing.txt"):
        convert([good, gone], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_long_lines_and_tiny_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(criteo, "BLOCK_BYTES", 16)  # every line is longer than a block
    big = "9" * 5000  # also a dense value far longer than the fast path's 8 characters
    p = write(tmp_path / "a.txt", "\n".join([line(ints=[big] + ["1"] * 12), line(1)] * 3))
    rep = convert(p, tmp_path / "out")
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (6, 6, 0)
    dense, _, label = load_all(tmp_path / "out")
    assert dense[0, 0] == pytest.approx(5000 * math.log(10), rel=1e-6)
    assert label.tolist() == [0, 1] * 3


# ------------------------------------------------------------------------------------ output

def test_eval_fraction_split(tmp_path):
    a = write(tmp_path / "a.txt", "\n".join(line(ints=[i] * 13) for i in range(60)) + "\n")
    b = write(tmp_path / "b.txt", "\n".join(line(ints=[i] * 13) for i in range(60, 100)) + "\n")
    rep = convert([a, b], tmp_path / "out", eval_fraction=0.25)
    assert (rep.train_rows, rep.eval_rows) == (75, 25)
    s = load(tmp_path / "out")
    # the LAST lines (time order, files concatenated) are held out
    np.testing.assert_allclose(s["train"][0][:, 0], np.log1p(np.arange(75, dtype=np.float32)))
    np.testing.assert_allclose(s["eval"][0][:, 0], np.log1p(np.arange(75, 100, dtype=np.float32)))

    rep = convert([a, b], tmp_path / "out0", eval_fraction=0.0)
    assert (rep.train_rows, rep.eval_rows) == (100, 0)
    meta = json.loads((tmp_path / "out0" / "meta.json").read_text())
    assert meta["splits"]["eval"] == {"rows": 0, "parts": [], "label_sum": 0.0}

    # bad lines count as lines: line 99 is bad, so eval (the last 10 lines) has 9 rows
    lines = [line()] * 100
    lines[98] = "bad"
    c = write(tmp_path / "c.txt", "\n".join(lines) + "\n")
    rep = convert(c, tmp_path / "out2", eval_fraction=0.1)
    assert (rep.train_rows, rep.eval_rows, rep.bad_lines) == (90, 9, 1)

    for frac in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="eval_fraction"):
            convert(a, tmp_path / "out3", eval_fraction=frac)


def test_table_sizes_and_overrides(tmp_path):
    vals = [f"{v:08x}" for v in range(26)]
    p = write(tmp_path / "a.txt", "\n".join(line(cats=vals) for _ in range(3)) + "\n")
    convert(p, tmp_path / "out", table_size=1000, table_size_overrides={"C1": 2, "C26": 5})
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    rows = [t["rows"] for t in meta["tables"]]
    assert rows == [2] + [1000] * 24 + [5]
    assert [t["name"] for t in meta["tables"]] == [f"C{i}" for i in range(1, 27)]
    sparse = load_all(tmp_path / "out")[1]
    assert (sparse[:, 0] == 1).all()  # a 2-row table: one id for all present values
    for t in range(26):
        assert sparse[0, t] == hash_category(np.array([t], np.uint32), rows[t])[0]
        assert 1 <= sparse[0, t] < rows[t]

    with pytest.raises(ValueError, match="'C27'"):
        convert(p, tmp_path / "o2", table_size_overrides={"C27": 10})
    with pytest.raises(ValueError, match="'c1'"):
        convert(p, tmp_path / "o2", table_size_overrides={"c1": 10})
    with pytest.raises(ValueError, match="C3"):
        convert(p, tmp_path / "o2", table_size_overrides={"C3": 1})
    with pytest.raises(ValueError, match="table_size"):
        convert(p, tmp_path / "o2", table_size=1)
    with pytest.raises(ValueError, match="table_size"):
        convert(p, tmp_path / "o2", table_size=2**31)
    assert not (tmp_path / "o2").exists()


def test_refuses_to_overwrite(tmp_path):
    p = write(tmp_path / "a.txt", "\n".join([line()] * 5) + "\n")
    out = tmp_path / "out"
    convert(p, out, eval_fraction=0.2)
    with pytest.raises(FileExistsError, match=str(out)):
        convert(p, out)
    p2 = write(tmp_path / "b.txt", line(1) + "\n")
    rep = convert(p2, out, overwrite=True)
    assert rep.rows_written == 1
    assert load_all(out)[2].tolist() == [1.0]
    assert not (out / "eval" / "part-00000.label.npy").exists()  # stale part removed


def test_progress_bar_runs(tmp_path, capsys):
    p = write(tmp_path / "a.txt", line() + "\n")
    assert convert(p, tmp_path / "out", progress=True).rows_written == 1


# ------------------------------------------------------------------------------------ writer

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
    dense, sparse, label = load_all(tmp_path / "out")
    assert label.tolist() == labels.tolist()
    x = np.where(ints == MISSING_INT, 0, np.maximum(ints, 0)).astype(np.float64)
    np.testing.assert_allclose(dense, np.log1p(x).astype(np.float32), rtol=1e-6)
    expect = np.where(cats < 0, 0, hash_category(np.where(cats < 0, 0, cats), 5000))
    assert (sparse == expect).all()


def test_write_criteo_tsv_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="shapes"):
        write_criteo_tsv(tmp_path / "x", np.zeros(2, int), np.zeros((2, 12), int),
                         np.zeros((2, 26), int))
    with pytest.raises(ValueError, match="cats"):
        write_criteo_tsv(tmp_path / "x", np.zeros(1, int), np.zeros((1, 13), int),
                         np.full((1, 26), 2**32))


# ------------------------------------------------------------------------------------ fuzzing

JUNK = ["", "", "0", "1", "-1", "2.5", "abc", "1234567", "12345678", "123456789", "-", "-0",
        "12345678901234567890123", "0x12", "ABCDEF12", "abcdefgh", "abcdef12", "\r", "1.0", "0.0",
        "-1.0", " 1", "1 ", "00000000", "ffffffff", "FFFFFFFF", "fffffffff", "-5", "1.00",
        "5.", "99999999", "-9999999", "9999999.0", "\x00", "\x01\x02", "é", "0000000g", "1e5",
        "+3", ".0", "--1", "a", "\x7f\x7f\x7f\x7f\x7f\x7f\x7f\x7f", "GGGGGGGG", "@@@@@@@@",
        "````````", "////////", "::::::::", "1.0.0", "00.0", "3.000000", "1:", "9:", "1234567:",
        "/1", "12/4", ":", "1.:", "1./", "1:0", "0000000:", "0000000/", "0000000g", "0000000`",
        "0000000G", "0000000@", "/0000000", "g0000000", "`0000000", "@0000000", "0000:000",
        ":1234567", "/1234567", "1234:678"]


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
        elif r < 0.42:
            fields = [rng.choice(JUNK)]
        s = sep.join(fields)
        if rng.random() < 0.1:
            s += "\r"
        out.append(s)
    return out


@pytest.mark.parametrize("block", [64, 1000, 1 << 20])
@pytest.mark.parametrize("csv", [False, True])
def test_vectorized_parser_agrees_with_reference(tmp_path, monkeypatch, block, csv):
    monkeypatch.setattr(criteo, "BLOCK_BYTES", block)
    rng = random.Random(block * 2 + csv)
    lines = random_lines(rng, 600, "," if csv else "\t")
    head = CSV_HEADER.decode() + "\n" if csv else ""
    raw = [ln.encode("utf-8") for ln in lines]
    p = write(tmp_path / "f.txt", head.encode() + b"\n".join(raw))  # last line unterminated
    if raw[-1] in (b"", b"\r"):
        raw = raw[:-1]  # a blank last line is skipped
    dense, sparse, label, bad = reference_rows(raw, csv, 777)
    assert 0 < bad < len(raw)
    rep = convert(p, tmp_path / "out", table_size=777)
    assert (rep.lines, rep.bad_lines, rep.rows_written) == (len(raw), bad, len(raw) - bad)
    got_dense, got_sparse, got_label = load_all(tmp_path / "out")
    assert got_label.tolist() == label.tolist()
    assert (got_sparse == sparse).all()
    np.testing.assert_array_equal(got_dense, dense)
    for e in rep.examples:  # reported lines really are bad, for the reported reason
        with pytest.raises(CriteoFormatError) as err:
            parse_line(raw[e.line - 1 - csv], csv)
        assert str(err.value) == e.reason


# ------------------------------------------------------------------------------------ real data

def test_real_samples(tmp_path):
    kaggle = SHARED / "criteo_kaggle_train_head1k" / "train_head1k.txt"
    deepctr = SHARED / "criteo_sample_deepctr" / "criteo_sample.txt"
    if not (kaggle.is_file() and deepctr.is_file()):
        pytest.skip(f"Criteo samples not found under {SHARED}")
    rep = convert(kaggle, tmp_path / "k", eval_fraction=0.1)
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (1000, 1000, 0)
    assert (rep.train_rows, rep.eval_rows) == (900, 100)
    dense, sparse, label = load_all(tmp_path / "k")
    assert int(label.sum()) == 205  # per the sample's README
    # line 1: "0 1 1 5 0 1382 4 15 2 181 1 2 _ 2 68fd1e64 ..."
    np.testing.assert_allclose(dense[0], np.log1p(np.float32([1, 1, 5, 0, 1382, 4, 15, 2, 181,
                                                              1, 2, 0, 2])), rtol=1e-6)
    assert sparse[0, 0] == hash_category(np.array([0x68FD1E64], np.uint32), 1_000_000)[0]
    assert sparse[0, 21] == 0  # C22 is empty on line 1

    rep = convert(deepctr, tmp_path / "d", eval_fraction=0.1)
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (200, 200, 0)
    dense, _, label = load_all(tmp_path / "d")
    assert int(label.sum()) == 49
    assert dense[0, 2] == np.float32(math.log1p(260))  # "260.0"
    assert dense[1, 1] == 0  # "-1"


def test_real_paddlerec_sample_without_trailing_newline(tmp_path):
    path = SHARED / "criteo_raw_paddlerec" / "sample_train.txt"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    assert not path.read_bytes().endswith(b"\n")
    rep = convert(path, tmp_path / "p", eval_fraction=0.1)
    assert (rep.lines, rep.rows_written, rep.bad_lines, rep.eval_rows) == (100, 100, 0, 10)
    assert int(load_all(tmp_path / "p")[2].sum()) == 29


def test_a_line_longer_than_the_bound_is_refused_with_bounded_memory(tmp_path, monkeypatch):
    """Issue 29: one long line grew the reader's carry without bound (quadratic copies). The
    refusal's peak memory is the reader's fixed buffers, whatever the line's length."""
    import gzip
    import tracemalloc

    from recsync.data import convert_input
    bound = 1 << 20
    monkeypatch.setattr(convert_input, "MAX_LINE_BYTES", bound)
    good = "1" + "\t1" * 13 + "\t68fd1e64" * 26 + "\n"

    def refuse(times: int) -> int:
        path = tmp_path / f"day{times}.gz"
        with gzip.open(path, "wt") as f:
            f.write(good * 3 + "0\t" + "9" * (times * bound) + "\n" + good)
        tracemalloc.start()
        try:
            with pytest.raises(CriteoFormatError, match=rf"day{times}\.gz: a line at byte "
                                                        r"[\d,]+ is longer than 1,048,576 bytes"
                               ) as e:
                convert_criteo([path], tmp_path / f"out{times}", progress=False)
            assert "\n" not in str(e.value)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    short, long = refuse(32), refuse(128)  # both past the scan's 16 MB reads
    assert long < 1.25 * short + 4 * bound, (short, long)
