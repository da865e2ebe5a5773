"""Vectorized parsing of Criteo text: whole blocks of bytes at once with numpy (SWAR decoding
of dense and hex fields, hashing of categories), giving the same rows and bad lines as the
reference parser in :mod:`recsync.data.criteo_rules`.

Only rare fields (dense values longer than 8 characters, or fields the fast path rejects) and the
reasons of bad lines go through the reference parser; the tests hold the two to the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsync.data.criteo_rules import NUM_FIELDS, CriteoFormatError, dense_log1p, parse_line
from recsync.data.format import NUM_DENSE
from recsync.hashing import splitmix64

MAX_EXAMPLES = 10  # bad lines whose reasons are kept (per block here, per conversion in reports)
PAD = 16  # zero bytes after every block, so 8-byte windows at any field start stay in bounds

# SWAR byte-lane constants
_ONES = 0x0101010101010101
_HIGH = 0x8080808080808080
_ASCII0 = 0x3030303030303030
_NIB = 0x0F0F0F0F0F0F0F0F
_F0 = 0xF0F0F0F0F0F0F0F0
# indexed by the digit count d (1..8) of a dense value held in the low d bytes of a word:
_DMASK = np.array([(1 << (8 * d)) - 1 for d in range(9)], dtype=np.uint64)
_DSHIFT = np.array([8 * (8 - d) if d else 0 for d in range(9)], dtype=np.uint64)
_DFILL = np.array([_ASCII0 & ((1 << (8 * (8 - d))) - 1) for d in range(9)], dtype=np.uint64)
_U = np.uint64


@dataclass
class ParsedBlock:
    n_lines: int
    ok_idx: np.ndarray  # local line indices of the rows below, increasing
    label: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    bad_idx: np.ndarray  # local line indices of bad lines
    reasons: list[str]  # reasons of the first MAX_EXAMPLES bad lines


def _decode_dense(w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fast path for dense fields of <= 8 characters.

    ``w``: uint64 little-endian 8-byte windows at the field starts; ``n``: field lengths.
    Returns (ok, log1p value as float32); ok is False for fields the fast path does not handle
    (longer than 8 characters, or anything unusual), which then go to the reference parser.
    """
    neg = (w & _U(0xFF)) == _U(0x2D)
    w1 = w >> (neg.astype(np.uint64) << _U(3))
    n1 = n - neg
    # optional ".0" suffix (other zero fractions take the slow path)
    tail2 = (w1 >> (np.clip(n1 - 2, 0, 6).astype(np.uint64) << _U(3))) & _U(0xFFFF)
    suffix = (n1 >= 3) & (tail2 == _U(0x302E))  # ".0" at n1-2, n1-1 (little-endian pair)
    d = n1 - 2 * suffix
    dc = np.clip(d, 1, 8)
    x = ((w1 & _DMASK[dc]) << _DSHIFT[dc]) | _DFILL[dc]  # digits right-aligned, '0'-padded
    ok = (x & _U(_F0)) == _U(_ASCII0)
    ok &= ((x + _U(0x0606060606060606)) & _U(_F0)) == _U(_ASCII0)
    ok &= (d >= 1) & (n <= 8)
    # Lemire's 8-digit SWAR parse (byte 0 = most significant digit)
    x &= _U(_NIB)
    x = (x * _U(2561)) >> _U(8)
    x &= _U(0x00FF00FF00FF00FF)
    x = (x * _U(6553601)) >> _U(16)
    x &= _U(0x0000FFFF0000FFFF)
    x = (x * _U(42949672960001)) >> _U(32)
    x[neg] = 0
    val = np.log1p(x.astype(np.float64)).astype(np.float32)
    missing = n == 0
    val[missing] = 0.0
    ok |= missing
    return ok, val


def _decode_hex(w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-hex-digit fields: (ok, missing, uint64 value) from 8-byte windows ``w`` and lengths."""
    hi = w & _U(_HIGH)
    dig = (w + _U(0x50 * _ONES)) & ~(w + _U(0x46 * _ONES))  # 0x30 <= c <= 0x39
    y = w | _U(0x20 * _ONES)
    alpha = (y + _U(0x1F * _ONES)) & ~(y + _U(0x19 * _ONES))  # 0x61 <= c|0x20 <= 0x66
    dig |= alpha
    dig &= _U(_HIGH)
    dig ^= _U(_HIGH)
    dig |= hi
    missing = n == 0
    ok = (dig == 0) & (n == 8)
    ok |= missing
    # nibble values, byte 0 = most significant nibble
    v = (w & _U(_NIB)) + ((w >> _U(6)) & _U(_ONES)) * _U(9)
    v = ((v & _U(0x000F000F000F000F)) << _U(4)) | ((v >> _U(8)) & _U(0x000F000F000F000F))
    v = ((v & _U(0x000000FF000000FF)) << _U(8)) | ((v >> _U(16)) & _U(0x000000FF000000FF))
    v = ((v & _U(0xFFFF)) << _U(16)) | ((v >> _U(32)) & _U(0xFFFF))
    return ok, missing, v


def parse_block(buf: bytearray, nbytes: int, csv: bool, mod_groups: list) -> ParsedBlock:
    """Parse ``buf[:nbytes]``: complete lines, each ending in ``\\n``, followed by >= PAD bytes."""
    data = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
    words = np.ndarray((nbytes,), dtype="<u8", buffer=buf, strides=(1,))
    if csv:
        mark = data == 44
        mark |= data == 10
        pos = np.flatnonzero(mark)
    else:
        pos = np.flatnonzero(data <= 10)  # tab (9) and newline (10); rarer bytes filtered below
        if len(pos):
            c = data[pos]
            if (c < 9).any():
                pos = pos[c >= 9]
    is_nl = data[pos] == 10
    nl_at = np.flatnonzero(is_nl)
    n_lines = len(nl_at)
    nfields = np.diff(nl_at, prepend=-1)
    fstart = np.empty_like(pos)
    fstart[:1] = 0
    np.add(pos[:-1], 1, out=fstart[1:])
    good = nfields == NUM_FIELDS
    if good.all():
        cand = None
        ends = pos.reshape(n_lines, NUM_FIELDS)
        starts = fstart.reshape(n_lines, NUM_FIELDS)
    else:
        cand = np.flatnonzero(good)
        sel = nl_at[cand][:, None] + np.arange(1 - NUM_FIELDS, 1)
        ends = pos[sel]
        starts = fstart[sel]
    lens = ends - starts
    # strip a "\r" before the "\n"
    last_len = lens[:, -1]
    cr = (data[ends[:, -1] - 1] == 13) & (last_len > 0)
    last_len -= cr

    # label
    n0 = lens[:, 0]
    w0 = words[starts[:, 0]]
    b0 = (w0 & _U(0xFF)) - _U(0x30)  # wraps to huge for bytes < '0'
    lab_ok = (n0 == 1) & (b0 <= _U(1))
    if csv:
        w3 = w0 & _U(0xFFFFFF)
        lab_ok |= (n0 == 3) & ((w3 == _U(0x302E30)) | (w3 == _U(0x302E31)))
    label = b0.astype(np.float32)

    # dense
    dl = lens[:, 1:1 + NUM_DENSE]
    dense_ok, dense = _decode_dense(words[starts[:, 1:1 + NUM_DENSE]], dl)
    if not dense_ok.all():  # rare: long values, unusual zero fractions, bad values
        rr, cc = np.nonzero(~dense_ok)
        for r, c in zip(rr.tolist(), cc.tolist()):
            s = int(starts[r, 1 + c])
            v = dense_log1p(bytes(buf[s:s + int(dl[r, c])]))
            if v is not None:
                dense[r, c] = v
                dense_ok[r, c] = True

    # categorical
    cl = lens[:, 1 + NUM_DENSE:]
    cat_ok, missing, v = _decode_hex(words[starts[:, 1 + NUM_DENSE:]], cl)
    z = splitmix64(v)
    sparse = np.empty(z.shape, dtype=np.int32)
    for cols, m in mod_groups:
        if cols is None:
            sparse[:] = z % _U(m)
        else:
            sparse[:, cols] = z[:, cols] % _U(m)
    sparse += 1
    sparse[missing] = 0

    ok = lab_ok & dense_ok.all(axis=1) & cat_ok.all(axis=1)
    line_idx = np.arange(len(ok)) if cand is None else cand
    if not ok.all():
        keep = np.flatnonzero(ok)
        label, dense, sparse = label[keep], dense[keep], sparse[keep]
        ok_idx = line_idx[keep]
        good_line = np.zeros(n_lines, dtype=bool)
        good_line[ok_idx] = True
        bad_idx = np.flatnonzero(~good_line)
    else:
        ok_idx = line_idx
        bad_idx = np.flatnonzero(~good) if cand is not None else np.empty(0, dtype=np.int64)

    reasons = []
    if len(bad_idx):
        line_end = pos[nl_at]
        for i in bad_idx[:MAX_EXAMPLES].tolist():
            s = int(line_end[i - 1]) + 1 if i else 0
            try:
                parse_line(bytes(buf[s:int(line_end[i])]), csv)
            except CriteoFormatError as e:
                reasons.append(str(e))
            else:  # the fast path and the rule book disagree: a bug, never silently pass
                raise AssertionError(f"criteo parser inconsistency on line "
                                     f"{bytes(buf[s:int(line_end[i])])!r}")
    return ParsedBlock(n_lines, ok_idx, label, dense, sparse, bad_idx, reasons)


def mod_groups(table_rows: list[int]) -> list:
    """:func:`parse_block`'s ``mod_groups``: (table columns, or None for all, and rows - 1)."""
    sizes = sorted(set(table_rows))
    if len(sizes) == 1:
        return [(None, sizes[0] - 1)]
    return [(np.array([i for i, r in enumerate(table_rows) if r == s]), s - 1) for s in sizes]
