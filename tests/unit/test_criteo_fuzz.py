"""Fuzz `recsync data criteo` (the Criteo presets of the one conversion path): a few hundred
seeded mutations of a valid Criteo file (bytes deleted, inserted or replaced, fields dropped or
repeated, non-ASCII bytes, very long fields, blank lines, CRLF, truncation, gzip), converted
in-process with varied block sizes and through the CLI. No input may raise anything but a
documented user error, and every converted row must equal the reference parser's
(criteo_oracle.py). Run: pytest -q tests/unit/test_criteo_fuzz.py"""

from __future__ import annotations

import gzip
import random
import re

import numpy as np
import pytest
from click.testing import CliRunner

from criteo_oracle import CSV_HEADER, read_splits, reference_file
from recsync.cli import main
from recsync.data.convert import convert
from recsync.data.convert_input import ConvertError
from recsync.data.criteo import criteo_preset, criteo_schema


CASES = 300
ALPHABET = b"\t\n\r0123456789abcdefABCDEF-.,x g\x00\x7f\xff\xc3\xa9"


def valid_file(rng: random.Random, n: int) -> bytes:
    lines = []
    for _ in range(n):
        fields = [rng.choice("01")]
        fields += [rng.choice(["", str(rng.randrange(-5, 10 ** rng.randrange(1, 10)))])
                   for _ in range(13)]
        fields += [rng.choice(["", f"{rng.getrandbits(32):08x}"]) for _ in range(26)]
        lines.append("\t".join(fields))
    return ("\n".join(lines) + "\n").encode()


def _fields_op(data: bytes, rng: random.Random, op) -> bytes:
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    fields = lines[i].split(b"\t")
    op(fields, rng.randrange(len(fields)))
    lines[i] = b"\t".join(fields)
    return b"\n".join(lines)


def _lines_op(data: bytes, rng: random.Random, op) -> bytes:
    lines = data.split(b"\n")
    op(lines, rng.randrange(len(lines)))
    return b"\n".join(lines)


MUTATIONS = [
    lambda d, r: d[:(i := r.randrange(len(d) + 1))] + d[i + 1:],  # delete a byte
    lambda d, r: d[:(i := r.randrange(len(d) + 1))] + bytes([r.choice(ALPHABET)]) + d[i:],
    lambda d, r: d[:(i := r.randrange(len(d) + 1))] + bytes([r.choice(ALPHABET)]) + d[i + 1:],
    lambda d, r: _fields_op(d, r, lambda f, j: f.pop(j)),  # drop a field
    lambda d, r: _fields_op(d, r, lambda f, j: f.insert(j, f[j])),  # repeat a field
    lambda d, r: _fields_op(d, r, lambda f, j: f.__setitem__(  # a very long field
        j, bytes([r.choice(b"9a-")]) * r.choice([9, 301, 5000]))),
    lambda d, r: _fields_op(d, r, lambda f, j: f.__setitem__(j, r.randbytes(8))),  # any bytes
    lambda d, r: _lines_op(d, r, lambda ls, j: ls.insert(j, r.choice([b"", b"\r"]))),
    lambda d, r: _lines_op(d, r, lambda ls, j: ls.insert(j, ls[j])),  # repeat a line
    lambda d, r: _lines_op(d, r, lambda ls, j: ls.__setitem__(j, ls[j] + b"\r")),  # CRLF
    lambda d, r: d.replace(b"\n", b"\r\n"),  # CRLF everywhere
    lambda d, r: d[:r.randrange(len(d) + 1)],  # truncated
    lambda d, r: d + r.choice([b"\n", b"\n\n", b"\r\n", b"\n\r\n\n"]),  # trailing blank lines
    lambda d, r: d.rstrip(b"\n"),  # no final newline
]


def mutated(seed: int) -> tuple[bytes, int, float, int, bool]:
    """Case ``seed``: (file bytes, table size, eval fraction, block bytes, gzip it)."""
    rng = random.Random(seed)
    data = valid_file(rng, rng.randrange(1, 25))
    if rng.random() < 0.1:
        data = CSV_HEADER + b"\n" + data.replace(b"\t", b",")
    for _ in range(rng.randrange(1, 5)):
        data = rng.choice(MUTATIONS)(data, rng)
    return (data, rng.choice([2, 97, 1_000_000]), rng.choice([0.0, 0.1, 0.5]),
            rng.choice([64, 300, 4096, 2 << 20]), rng.random() < 0.1)


@pytest.mark.parametrize("first", range(0, CASES, 50))
def test_mutated_files_convert_exactly_as_the_reference_parses(tmp_path, monkeypatch, first):
    accepted = 0
    for seed in range(first, first + 50):
        data, table_size, eval_fraction, block, packed = mutated(seed)
        src = tmp_path / f"in-{seed}"
        src.write_bytes(gzip.compress(data) if packed else data)
        out = tmp_path / f"out-{seed}"
        want = reference_file(data, table_size, eval_fraction)
        try:
            schema = criteo_schema(criteo_preset([src]), table_size=table_size,
                                   eval_fraction=eval_fraction)
            rep = convert([src], schema, out, progress=False, block_bytes=block)
        except ConvertError as e:
            assert isinstance(want, str), (seed, str(e))
            assert re.search(want, str(e)), (seed, str(e))
            assert "\n" not in str(e) and not out.exists()
            continue
        assert not isinstance(want, str), (seed, want)
        (train, held, bad) = want
        assert rep.bad_lines == bad, seed
        got = read_splits(out)
        for split, ref in (("train", train), ("eval", held)):
            dense, sparse, label = got[split]
            assert label.tolist() == ref[2].tolist(), (seed, split)
            assert (sparse == ref[1]).all(), (seed, split)
            np.testing.assert_array_equal(dense, ref[0], err_msg=f"seed {seed} {split}")
        accepted += 1
    assert 10 < accepted < 50  # the mutations make both kinds of outcome


@pytest.mark.parametrize("seed", [3, 11, 18, 137])  # accepted twice, refused twice
def test_mutated_files_through_the_cli(tmp_path, seed):
    data, table_size, eval_fraction, _, _ = mutated(seed)
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    result = CliRunner().invoke(main, ["data", "criteo", str(src), "--out", str(tmp_path / "o"),
                                       "--table-size", str(table_size),
                                       "--eval-fraction", str(eval_fraction)])
    assert "Traceback" not in result.output
    if isinstance(reference_file(data, table_size, eval_fraction), str):
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
        assert "error: " in result.output and not (tmp_path / "o").exists()
    else:
        assert result.exit_code == 0 and result.exception is None, result.output
