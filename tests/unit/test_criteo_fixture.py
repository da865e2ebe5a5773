"""The one conversion path writes exactly the ids and values the former `recsync data criteo`
converter wrote (commit fb20e10), so data sets and models made before it joined the one path
stay valid. The rows are synthetic, drawn from a seeded generator here (no file is kept: data
files do not belong in the repository), and the former converter's arrays are pinned as dtype,
shape and SHA-256."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from recsync.bench.criteo_file import write_criteo_tsv
from recsync.cli import main

RAW_SHA256 = "bd7e9a0d36a4ac4b0007a3053c334930645bc29b714eb40a338614db8fde9ff6"  # the 96 lines
DIGESTS = {  # each part file's array as the former converter wrote it: dtype, shape, SHA-256
    "eval/part-00000.dense.npy": {"dtype": "float32", "shape": [24, 13],
        "sha256": "893a25cd53125d119c92789b22013cbf38e1aa0a11533509b13a03e327ef99dd"},
    "eval/part-00000.label.npy": {"dtype": "float32", "shape": [24],
        "sha256": "9a5566c9d1768b32ed93b5e3d5492ad6bc661e6ab7da4e3c6b326418f396ed2b"},
    "eval/part-00000.sparse.npy": {"dtype": "int32", "shape": [24, 26],
        "sha256": "7214d3d467dc4aa9e025b270e7f2757e23f69b2a1811b0a3a9365b7a5a991269"},
    "train/part-00000.dense.npy": {"dtype": "float32", "shape": [72, 13],
        "sha256": "e9db6fcfc6ccfca557134b9d7b209c4a54e9ba50bc5d3478df81953cb10164f5"},
    "train/part-00000.label.npy": {"dtype": "float32", "shape": [72],
        "sha256": "e6f4a21d470655a825b278c7645e87a1e8207967ce4f7aabaf160f7bbe0f9d11"},
    "train/part-00000.sparse.npy": {"dtype": "int32", "shape": [72, 26],
        "sha256": "68ae6f1e99a57b56deeaa8fd335d7745e7415dfd3408d1c91c4a3da045d468b4"},
}


def write_raw(path: Path) -> None:
    """The 96 raw lines the former converter was given (its fixture's generator, seed 7)."""
    rng = np.random.default_rng(7)
    n = 96
    labels = rng.integers(0, 2, n)
    ints = rng.integers(-2, 5000, (n, 13))
    ints[rng.random((n, 13)) < 0.2] = np.iinfo(np.int64).min  # missing
    cats = rng.integers(0, 40, (n, 26)) * 104729 + 0x10000000  # few values per column
    cats[rng.random((n, 26)) < 0.1] = -1
    write_criteo_tsv(path, labels, ints, cats)


def digests(root: Path) -> dict:
    return {str(p.relative_to(root)): {"dtype": str(a.dtype), "shape": list(a.shape),
                                       "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
            for p in sorted(root.glob("*/*.npy")) for a in [np.ascontiguousarray(np.load(p))]}


def test_the_alias_writes_what_the_former_converter_wrote(tmp_path):
    raw = tmp_path / "raw.tsv"
    write_raw(raw)
    assert hashlib.sha256(raw.read_bytes()).hexdigest() == RAW_SHA256  # the same lines
    r = CliRunner().invoke(main, ["data", "criteo", str(raw), "--out", str(tmp_path / "d"),
                                  "--table-size", "64", "--eval-fraction", "0.25"])
    assert r.exit_code == 0, r.output
    assert digests(tmp_path / "d") == DIGESTS
