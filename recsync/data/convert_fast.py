"""The fast path of ``recsync data convert`` for a block of text lines: fields split with numpy,
numbers decoded and categorical values hashed straight from the block's bytes (SWAR: eight
bytes at a time), without building an Arrow table.

It gives exactly what the CSV reader path (convert_csv.read_text_block) gives, or declines
(None) and that path reads the block: when the block holds a quote or a carriage return that
does not end a line, a blank line, or a number column (label, weight, dense) holds a value that
is not a number, or many that are not short integers (a few decimals, exponents or long numbers
are decoded one by one). The tests hold the two paths to the same output.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from recsync.data.hashing import SPLITMIX_GAMMA
from recsync.data.value_hash import (FNV_OFFSET, FNV_PRIME, _fnv_rows, dynamic_ids,
                                     hex32_words)

# what pyarrow's string -> float64 cast accepts and a finite number needs (no inf, nan, 0x..)
NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_NUMBER = re.compile(NUMBER.encode())
PAD = 16  # zero bytes after the block, so an 8-byte window at any field start stays in bounds
_LONG = 1 << 16  # bytes: a field this long is copied as a slice (block_column)
_ODD_FIELDS = 64  # number fields of a block decoded one by one at most (or 1/64 of them)
_U = np.uint64
_ASCII0 = 0x3030303030303030
_F0 = 0xF0F0F0F0F0F0F0F0
# indexed by the digit count d (1..8) of a number held in the low d bytes of a word:
_DMASK = np.array([(1 << (8 * d)) - 1 for d in range(9)], dtype=np.uint64)
_DSHIFT = np.array([8 * (8 - d) if d else 0 for d in range(9)], dtype=np.uint64)
_DFILL = np.array([_ASCII0 & ((1 << (8 * (8 - d))) - 1) for d in range(9)], dtype=np.uint64)


class FastBlock:
    """The rows of a block whose field count is right (``invalid``: the others, as
    read_text_block reports them), as parse() reads them: ``numbers(column)``, ``sparse`` (ids
    of the plan's categorical features, plan.id_dtype [rows, features]), and any column as an Arrow
    array in ``cols`` (built on first use: split column, multi-hot, values for messages)."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                 where: dict[str, int], nums: dict, sparse: np.ndarray | None, invalid: list):
        self.data, self.starts, self.lengths, self.where = data, starts, lengths, where
        self.nums, self.sparse, self.invalid = nums, sparse, invalid
        self.num_rows = len(lengths)
        self.cols = _Columns(data, starts, lengths, where)

    def numbers(self, column: str):
        return self.nums[column]

    def filter(self, keep: np.ndarray) -> FastBlock:
        return FastBlock(self.data, self.starts[keep], self.lengths[keep], self.where,
                         {c: tuple(a[keep] for a in v) for c, v in self.nums.items()},
                         None if self.sparse is None else self.sparse[keep], [])


def block_column(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The fields as a binary array, empty ones null (as the CSV reader gives them).

    Short fields are gathered through an index per byte; a long one (a line of many MB) is
    copied as a slice, so memory stays a few times the block's, not 24 bytes per byte."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    long = lengths > _LONG
    if not long.any():
        data = buf[np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])]
    else:
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        short = np.flatnonzero(~long)
        ls = lengths[short]
        within = np.arange(int(ls.sum())) - np.repeat(np.cumsum(ls) - ls, ls)
        data[np.repeat(offsets[short], ls) + within] = buf[np.repeat(starts[short], ls) + within]
        for i in np.flatnonzero(long).tolist():
            data[offsets[i]:offsets[i + 1]] = buf[starts[i]:starts[i] + lengths[i]]
    present = lengths > 0
    nulls = len(present) - int(np.count_nonzero(present))
    bitmap = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.binary(), len(lengths),
                                 [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


class _Columns(dict):
    """Columns as Arrow arrays, built on first use (no reference to the block: no cycle, so a
    block's memory goes as soon as it is parsed)."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                 where: dict[str, int]):
        super().__init__()
        self.data, self.starts, self.lengths, self.where = data, starts, lengths, where

    def __missing__(self, c: str) -> pa.Array:
        j = self.where[c]
        self[c] = block_column(self.data, self.starts[:, j], self.lengths[:, j])
        return self[c]


def fast_block(data: bytes, names: list[str], plan, delimiter: str) -> FastBlock | None:
    """A block of whole lines (the last ending in ``\\n``) read as convert_parse's
    read_text_block would, or None where this path does not apply."""
    if b'"' in data:
        return None
    cr = data.find(b"\r") >= 0
    if cr and data.count(b"\r") != data.count(b"\r\n"):
        return None
    nbytes = len(data)
    buf = np.zeros(nbytes + PAD, dtype=np.uint8)
    buf[:nbytes] = np.frombuffer(data, dtype=np.uint8)
    words = np.ndarray((nbytes,), dtype="<u8", buffer=buf, strides=(1,))
    d = buf[:nbytes]
    if delimiter == "\t":  # tab (9) and newline (10): one comparison, rarer bytes dropped
        pos = np.flatnonzero(d <= 10)
        at = d[pos]
        if len(pos) and (at < 9).any():
            pos, at = pos[at >= 9], at[at >= 9]
    else:
        mark = d == 10
        mark |= d == ord(delimiter)
        pos = np.flatnonzero(mark)
        at = d[pos]
    nl_at = np.flatnonzero(at == 10)
    nfields = np.diff(nl_at, prepend=-1)
    ncols = len(names)
    good = nfields == ncols
    fstart = np.empty_like(pos)
    fstart[:1] = 0
    np.add(pos[:-1], 1, out=fstart[1:])
    invalid = []
    if good.all():
        ends, starts = pos.reshape(-1, ncols), fstart.reshape(-1, ncols)
    else:
        bad = np.flatnonzero(~good)
        one = nl_at[bad[nfields[bad] == 1]]  # the newlines of lines of one field
        size = pos[one] - fstart[one]
        if ((size == 0) | ((size == 1) & (buf[pos[one] - 1] == 13))).any():
            return None  # a blank line: the CSV reader makes a row of nulls of it
        invalid = [(int(i), f"expected {ncols} fields, got {int(nfields[i])}")
                   for i in bad.tolist()]
        sel = nl_at[good][:, None] + np.arange(1 - ncols, 1)
        ends, starts = pos[sel], fstart[sel]
    index = {c: i for i, c in enumerate(names)}
    cols = plan.columns()
    where = {c: j for j, c in enumerate(cols)}
    if cols != names:
        take = np.array([index[c] for c in cols])
        starts, ln = starts[:, take], ends[:, take]
        ln -= starts
    else:
        ln = ends - starts
    if cr and names[-1] in where:  # "\r\n" line ends: the last field ends before the "\r"
        j = where[names[-1]]
        ln[:, j] -= (buf[ends[:, -1] - 1] == 13) & (ln[:, j] > 0)
    numeric = [c for c in dict.fromkeys((plan.label, plan.weight, *(x[1] for x in plan.dense)))
               if c]
    k = _columns([where[c] for c in numeric])
    got = _numbers(buf, words[starts[:, k]], ln[:, k], starts[:, k])
    if got is None:
        return None
    values, present, bad = got
    nums = {c: (values[:, i], present[:, i], bad[:, i]) for i, c in enumerate(numeric)}
    sparse = None
    if not plan.fit:  # the statistics pass reads no categorical column
        k = _columns([where[c[1]] for c in plan.cats])
        sparse = _ids(buf, words, plan, starts[:, k], ln[:, k])
    return FastBlock(buf, starts, ln, where, nums, sparse, invalid)


def _columns(k: list[int]):
    """Column indices as a slice where they are consecutive (a view, not a copy)."""
    if k and k == list(range(k[0], k[0] + len(k))):
        return slice(k[0], k[0] + len(k))
    return k


def _numbers(buf: np.ndarray, w: np.ndarray, n: np.ndarray, starts: np.ndarray):
    """(float64 values, 0 where missing or bad; present; bad: present but not finite) of number
    fields from their 8-byte windows ``w``, lengths ``n`` and ``starts`` in ``buf``, or None.

    An optional ``-``, 1 to 8 digits and an optional ``.0`` are decoded all at once; any other
    field (decimals, exponents, long or signed zero values) one by one, as the CSV reader
    reads it, when it is a number (NUMBER) and such fields are few. None where a field is
    not a number, or too many fields are odd: the CSV reader then reads the block."""
    neg = ((w & _U(0xFF)) == _U(0x2D)) & (n > 0)
    w1 = w >> (neg.astype(np.uint64) << _U(3))
    n1 = n - neg
    tail2 = (w1 >> (np.clip(n1 - 2, 0, 6).astype(np.uint64) << _U(3))) & _U(0xFFFF)
    suffix = (n1 >= 3) & (tail2 == _U(0x302E))  # ".0" (a little-endian pair of bytes)
    digits = n1 - 2 * suffix
    dc = np.clip(digits, 1, 8)
    x = ((w1 & _DMASK[dc]) << _DSHIFT[dc]) | _DFILL[dc]  # digits right-aligned, '0'-padded
    ok = (x & _U(_F0)) == _U(_ASCII0)
    ok &= ((x + _U(0x0606060606060606)) & _U(_F0)) == _U(_ASCII0)
    ok &= (digits >= 1) & (n <= 8)  # the window holds the whole field
    x &= _U(0x0F0F0F0F0F0F0F0F)  # Lemire's 8-digit SWAR parse (byte 0 = most significant)
    x = (x * _U(2561)) >> _U(8)
    x &= _U(0x00FF00FF00FF00FF)
    x = (x * _U(6553601)) >> _U(16)
    x &= _U(0x0000FFFF0000FFFF)
    x = (x * _U(42949672960001)) >> _U(32)
    ok &= ~(neg & (x == 0))  # -0: the CSV reader's -0.0
    present = n > 0
    values = x.astype(np.float64)
    values *= present  # (a multiply: faster than a masked store)
    np.negative(values, out=values, where=neg)
    bad = np.zeros(n.shape, dtype=bool)
    rr, cc = np.nonzero(~ok & present)
    if len(rr) > max(_ODD_FIELDS, n.size // 64):
        return None
    for r, c in zip(rr.tolist(), cc.tolist()):
        text = buf[starts[r, c]:starts[r, c] + n[r, c]].tobytes().strip(b" \t")
        if _NUMBER.fullmatch(text) is None:
            return None
        v = float(text)
        values[r, c], bad[r, c] = (v, False) if np.isfinite(v) else (0.0, True)
    return values, present, bad


def _ids(buf: np.ndarray, words: np.ndarray, plan, starts: np.ndarray,
         lengths: np.ndarray) -> np.ndarray:
    """plan.id_dtype [rows, categorical features]: value_hash's ids (1 + hash % (rows - 1), or
    a dynamic table's full hash; 0 for an empty field) of the fields at ``starts`` with
    ``lengths`` ([rows, features]), hashed from the block's bytes."""
    n, k = lengths.shape
    if not k:
        return np.zeros((n, 0), dtype=np.int32)
    hexed = [j for j, c in enumerate(plan.cats) if c[3] == "hex32"]
    if len(hexed) == k:  # (Criteo: every column, no copies of the windows per column)
        ok, h = hex32_words(words[starts], lengths)
        text = ~ok
    else:
        h = np.empty((n, k), dtype=np.uint64)
        text = np.ones((n, k), dtype=bool)  # hashed as text (not hex32 values)
        if hexed:
            ok, h[:, hexed] = hex32_words(words[starts[:, hexed]], lengths[:, hexed])
            text[:, hexed] = ~ok
    present = lengths > 0
    text &= present
    cols = np.flatnonzero(text.any(axis=0)) if text.any() else []
    if len(cols) == k and not hexed:
        h[:] = _text_hashes(buf, words, starts, lengths)
    elif len(cols):
        t = _text_hashes(buf, words, starts[:, cols], lengths[:, cols])
        sub = h[:, cols]
        np.copyto(sub, t, where=text[:, cols])
        h[:, cols] = sub
    z = _splitmix64(h)
    out = np.empty((n, k), dtype=plan.id_dtype)
    by_rows: dict[int, list[int]] = {}
    for j, c in enumerate(plan.cats):
        by_rows.setdefault(c[2], []).append(j)
    for rows, js in by_rows.items():
        if rows is None:  # dynamic tables: the full hash (value_hash.dynamic_ids)
            out[:, js] = dynamic_ids(z[:, js], present[:, js])
            continue
        m = _U(rows - 1)
        if len(js) == k:
            np.remainder(z, m, out=z)
            z += _U(1)
            z *= present  # id 0 for an empty field (a multiply: faster than a masked store)
            out[:] = z
        else:
            out[:, js] = (z[:, js] % m + _U(1)) * present[:, js]
    return out


def _text_hashes(buf: np.ndarray, words: np.ndarray, starts: np.ndarray,
                 lengths: np.ndarray) -> np.ndarray:
    """FNV-1a 64 [rows, columns] of the fields at ``starts`` with ``lengths``: a word at a time
    where a column's values fit in 8 bytes, else as value_hash hashes the column."""
    n, k = lengths.shape
    longest = lengths.max(axis=0) if n else np.zeros(k, dtype=np.int64)
    if (longest <= 8).all():
        return _fnv_words(words[starts], lengths, int(longest.max()))
    h = np.empty((n, k), dtype=np.uint64)
    for j in range(k):
        if longest[j] <= 8:
            h[:, j] = _fnv_words(words[starts[:, j]], lengths[:, j], int(longest[j]))
        else:
            col = block_column(buf, starts[:, j], lengths[:, j])
            h[:, j] = _fnv_rows(np.frombuffer(col.buffers()[2], dtype=np.uint8),
                                np.frombuffer(col.buffers()[1], dtype=np.int32)[:-1],
                                lengths[:, j])
    return h


def _fnv_words(w: np.ndarray, lengths: np.ndarray, hi: int) -> np.ndarray:
    """FNV-1a 64 of the first ``lengths`` (<= 8) bytes of each little-endian word of ``w``: the
    same as value_hash._fnv_rows, a word at a time."""
    shape = w.shape
    w, lengths = np.ascontiguousarray(w).reshape(-1), lengths.reshape(-1)
    h = np.full(w.shape, FNV_OFFSET, dtype=np.uint64)
    byte = w.view(np.uint8).reshape(-1, 8)
    same = bool(((lengths == hi) | (lengths == 0)).all())  # one length: no masks
    nxt = None if same else np.empty(w.shape, dtype=np.uint64)
    for j in range(hi):
        if same:
            np.bitwise_xor(h, byte[:, j], out=h, casting="unsafe")
            h *= FNV_PRIME
        else:
            np.bitwise_xor(h, byte[:, j], out=nxt, casting="unsafe")
            nxt *= FNV_PRIME
            np.copyto(h, nxt, where=lengths > j)
    return h.reshape(shape)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """recsync.data.hashing.splitmix64, in place (fewer temporaries)."""
    t = np.empty_like(z)
    z += _U(SPLITMIX_GAMMA)
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(z, _U(shift), out=t)
        z ^= t
        z *= _U(mul)
    np.right_shift(z, _U(31), out=t)
    z ^= t
    return z
