"""Write rows in the raw Criteo TSV layout: benchmarks make large Criteo-format files with it
(from synthetic rows), and tests make small ones. Vectorised: about 3 s per million lines."""

from __future__ import annotations

import numpy as np

from recsync.data.format import NUM_DENSE, NUM_TABLES

_U = np.uint64
_INT_MISSING = np.iinfo(np.int64).min
_HEXCHARS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _int_slots(v: np.ndarray, ndig: int) -> np.ndarray:
    """[n, k] int64 -> [n, k, ndig + 2] uint8 text: '-' or 0, ndig digit slots, a tab; 0 bytes
    (leading zeros, missing values) are dropped when the rows are joined."""
    n, k = v.shape
    out = np.zeros((n, k, ndig + 2), dtype=np.uint8)
    out[:, :, -1] = 9
    present = v != _INT_MISSING
    neg = (v < 0) & present
    a = np.where(present, np.abs(np.where(present, v, 0)), 0).astype(np.uint64)
    out[:, :, 0] = np.where(neg, 45, 0)
    for j in range(ndig):  # j = digit position from the left
        p = _U(10 ** (ndig - 1 - j))
        d = ((a // p) % _U(10)).astype(np.uint8) + np.uint8(48)
        show = a >= p if j < ndig - 1 else np.ones_like(present)
        out[:, :, 1 + j] = np.where(show & present, d, 0)
    return out


def write_criteo_tsv(path, labels: np.ndarray, ints: np.ndarray, cats: np.ndarray) -> None:
    """Write rows in the raw Criteo TSV layout (label, I1..I13, C1..C26; tabs; ``\\n``).

    ``labels`` int [n]; ``ints`` int64 [n, 13], ``np.iinfo(np.int64).min`` = missing (empty);
    ``cats`` [n, 26] in [0, 2**32) as 8 lowercase hex digits, -1 = missing (empty).
    """
    labels = np.asarray(labels)
    ints = np.asarray(ints)
    cats = np.asarray(cats)
    n = len(labels)
    if labels.shape != (n,) or ints.shape != (n, NUM_DENSE) or cats.shape != (n, NUM_TABLES):
        raise ValueError(f"bad shapes: labels {labels.shape}, ints {ints.shape}, "
                         f"cats {cats.shape}")
    for name, a in (("labels", labels), ("ints", ints), ("cats", cats)):
        if a.dtype.kind not in "ui":
            raise ValueError(f"{name} must be integers, got dtype {a.dtype}")
    cats64 = cats.astype(np.int64)
    if n and (cats64.min() < -1 or cats64.max() > 0xFFFFFFFF):
        raise ValueError("cats must be in [0, 2**32) or -1 (missing)")
    allint = np.concatenate([labels.astype(np.int64)[:, None], ints.astype(np.int64)], axis=1)
    present = allint[allint != _INT_MISSING]
    biggest = int(np.abs(present).max()) if present.size else 0
    ndig = max(1, len(str(biggest)))
    chunk = 65536
    with open(path, "wb") as f:
        for s in range(0, n, chunk):
            iv = allint[s:s + chunk]
            cv = cats64[s:s + chunk]
            m = len(iv)
            islots = _int_slots(iv, ndig)
            cslots = np.zeros((m, NUM_TABLES, 9), dtype=np.uint8)
            cu = np.where(cv >= 0, cv, 0).astype(np.uint64)
            for j in range(8):
                nib = ((cu >> _U(4 * (7 - j))) & _U(0xF)).astype(np.intp)
                cslots[:, :, j] = np.where(cv >= 0, _HEXCHARS[nib], 0)
            cslots[:, :, 8] = 9
            cslots[:, -1, 8] = 10
            rows = np.concatenate([islots.reshape(m, -1), cslots.reshape(m, -1)], axis=1)
            f.write(rows[rows != 0].tobytes())
