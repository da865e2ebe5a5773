"""Conversions never lose a user's data: a data set is replaced only by a complete one, nothing
but an earlier data set is deleted, a failed or interrupted conversion leaves no trace; gzip,
bz2, zstd and xz inputs are read, zip refused by name.
Run: pytest -q tests/unit/test_conversion_safety.py"""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from recsync.cli import main
import pyarrow as pa

from criteo_oracle import CSV_HEADER
from recsync.data import convert as conversion
from recsync.data import synthetic
from recsync.data.convert_input import ConvertError
from recsync.data.synthetic import SynthSpec, generate
from test_criteo import line, load_all, write
from test_criteo import convert as convert_criteo


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones included) and its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def entries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    lines = [ln for ln in result.output.strip().splitlines()
             if not ln.startswith("convert: ")]  # the progress bars
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])


@pytest.fixture
def made(tmp_path):
    """A converted data set in tmp_path/work/out, and a good input file."""
    work = tmp_path / "work"
    work.mkdir()
    good = write(tmp_path / "good.txt", "\n".join(line(i % 2, ints=[i] * 13)
                                                  for i in range(20)) + "\n")
    assert cli("data", "criteo", good, "--out", work / "out", "--eval-fraction", 0.2).exit_code == 0
    return work, good


# ------------------------------------------------------------------------- --overwrite

@pytest.mark.parametrize("bad_input", ["strict_bad_line", "missing", "all_bad", "corrupt_gzip"])
def test_overwrite_with_bad_input_keeps_the_old_data_set(made, tmp_path, bad_input):
    work, _ = made
    before = snapshot(work)
    src = tmp_path / "bad.txt"
    flags = []
    if bad_input == "strict_bad_line":
        write(src, "\n".join([line()] * 30 + ["\t".join(["1"] * 39)]) + "\n")
        flags = ["--strict"]
    elif bad_input == "all_bad":
        write(src, "a\nb\n")
    elif bad_input == "corrupt_gzip":
        write(src, gzip.compress(("\n".join([line()] * 200) + "\n").encode())[:-30])
    result = cli("data", "criteo", src, "--out", work / "out", "--overwrite", *flags)
    assert_one_line_error(result, src)
    assert snapshot(work) == before  # byte for byte, and no temporary directory left beside


def test_overwrite_replaces_the_whole_data_set(made, tmp_path):
    work, _ = made
    src = write(tmp_path / "new.txt", line(1) + "\n")
    assert cli("data", "criteo", src, "--out", work / "out", "--overwrite").exit_code == 0
    assert load_all(work / "out")[2].tolist() == [1.0]
    assert entries(work) == ["out", "out/eval", "out/meta.json", "out/train",
                             "out/train/part-00000.dense.npy", "out/train/part-00000.label.npy",
                             "out/train/part-00000.sparse.npy"]  # no stale part, nothing beside


def test_without_overwrite_an_old_data_set_is_refused_before_reading_inputs(made, tmp_path):
    work, good = made
    before = snapshot(work)
    result = cli("data", "criteo", tmp_path / "not-there.txt", "--out", work / "out")
    assert_one_line_error(result, work / "out", "--overwrite")
    assert snapshot(work) == before


# ------------------------------------------------------------------------- the user's files

def test_a_directory_with_other_files_is_refused_with_or_without_overwrite(made, tmp_path):
    work, good = made
    notes = work / "mine"
    notes.mkdir()
    write(notes / "notes.txt", "keep me")
    for flags in ([], ["--overwrite"]):
        result = cli("data", "criteo", good, "--out", notes, *flags)
        assert_one_line_error(result, notes / "notes.txt", "not a recsync data set")
    assert snapshot(notes) == {"notes.txt": b"keep me"}


def test_a_users_backup_inside_a_data_set_is_never_deleted(made):
    work, good = made
    bak = work / "out" / "train" / "part-00000.dense.npy.bak"
    bak.write_bytes(b"the user's backup")
    before = snapshot(work)
    result = cli("data", "criteo", good, "--out", work / "out", "--overwrite")
    assert_one_line_error(result, bak)
    assert snapshot(work) == before


def test_synth_refuses_a_directory_with_other_files(tmp_path):
    write(tmp_path / "notes.txt", "keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        generate(tmp_path, rows=100, processes=1, progress=False, overwrite=True,
                 spec=SynthSpec(max_table_rows=50))
    assert snapshot(tmp_path) == {"notes.txt": b"keep me"}


def test_an_incomplete_data_set_needs_overwrite(tmp_path):
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    write(out / "train" / "part-00000.dense.npy", "left by a crash of an older recsync")
    src = write(tmp_path / "a.txt", line() + "\n")
    with pytest.raises(FileExistsError, match="incomplete data set"):
        convert_criteo(src, out)
    assert convert_criteo(src, out, overwrite=True).rows_written == 1


# ------------------------------------------------------------------------- failures leave no trace

def test_a_failed_conversion_leaves_no_new_directories(tmp_path):
    src = write(tmp_path / "x.txt", "\n".join([line()] * 5 + ["bad"]) + "\n")
    before = entries(tmp_path)
    with pytest.raises(ConvertError, match="x.txt:6"):
        convert_criteo(src, tmp_path / "new" / "deeper" / "out", strict=True)
    assert entries(tmp_path) == before  # no out, no train/ or eval/, no parents, no temp dir


@pytest.mark.parametrize("where", ["parse", "write", "meta"])
def test_ctrl_c_during_a_conversion_leaves_the_target_as_it_was(made, monkeypatch, where):
    work, good = made
    before = snapshot(work)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    target = {"parse": (conversion, "parse"), "write": (conversion.SplitWriter, "write"),
              "meta": (conversion, "write_meta")}[where]
    monkeypatch.setattr(*target, interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert_criteo(good, work / "out", overwrite=True)
    assert snapshot(work) == before
    with pytest.raises(KeyboardInterrupt):
        convert_criteo(good, work / "fresh")
    assert not (work / "fresh").exists() and snapshot(work) == before


def test_ctrl_c_during_synth_leaves_the_target_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out"
    generate(out, rows=100, processes=1, progress=False, spec=SynthSpec(max_table_rows=50))
    before = snapshot(tmp_path)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(synthetic, "write_meta", interrupt)
    with pytest.raises(KeyboardInterrupt):
        generate(out, rows=200, processes=1, progress=False, overwrite=True,
                 spec=SynthSpec(max_table_rows=50))
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------- compressed input

TEXT = ("\n".join(line(i % 2, ints=[i, "", -i] + [7] * 10,
                       cats=[f"{i * 2654435761 % 2**32:08x}", ""] + ["0000abcd"] * 24)
                  for i in range(300)) + "\n").encode()


def zstd(data: bytes) -> bytes:
    return pa.Codec("zstd").compress(data, asbytes=True)


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress, zstd])
@pytest.mark.parametrize("block", [100, 1 << 20])
def test_compressed_input_gives_the_same_rows_as_plain(tmp_path, compress, block):
    plain = write(tmp_path / "day_0", TEXT)  # block 100: lines cut across reads
    packed = write(tmp_path / "day_0.data", compress(TEXT))  # detected by content, not name
    a = convert_criteo(plain, tmp_path / "a", table_size=1000, eval_fraction=0.1,
                       block_bytes=block)
    b = convert_criteo(packed, tmp_path / "b", table_size=1000, eval_fraction=0.1,
                       block_bytes=block)
    assert (a.lines, a.train_rows, a.eval_rows) == (b.lines, b.train_rows, b.eval_rows) \
        == (300, 270, 30)
    for x, y in zip(load_all(tmp_path / "a"), load_all(tmp_path / "b")):
        np.testing.assert_array_equal(x, y)


def test_gzip_csv_with_header_and_several_members(tmp_path):
    body = "\n".join(line(1, sep=",") for _ in range(4)) + "\n"
    data = gzip.compress(CSV_HEADER + b"\n" + body[:50].encode()) + gzip.compress(
        body[50:].encode())  # concatenated gzip members, as `cat a.gz b.gz` makes
    rep = convert_criteo(write(tmp_path / "s.csv.gz", data), tmp_path / "out")
    assert (rep.lines, rep.rows_written, rep.bad_lines) == (4, 4, 0)


def test_a_zip_archive_is_refused_by_name(tmp_path):
    src = write(tmp_path / "day_0", b"PK\x03\x04" + b"\x00" * 40)
    result = cli("data", "criteo", src, "--out", tmp_path / "out")
    assert_one_line_error(result, src, "zip archive", "unzip it first")
    assert entries(tmp_path) == ["day_0"]


def test_a_truncated_gzip_file_is_named(tmp_path):
    src = write(tmp_path / "day_0.gz", gzip.compress(TEXT)[:-100])
    with pytest.raises(ConvertError, match=r"day_0\.gz: cannot be read") as e:
        convert_criteo(src, tmp_path / "out")
    assert "\n" not in str(e.value)
