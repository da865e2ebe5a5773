"""The hash that turns a categorical value's text into an embedding row id, vectorised.

    h  = FNV-1a 64 over the value's UTF-8 bytes      (offset 0xCBF29CE484222325,
                                                     prime 0x100000001B3, xor then multiply)
    h  = splitmix64(h)                               (recsync.data.hashing: a bijection that mixes
                                                     FNV's weak low bits)
    id = 1 + h % (rows - 1)                          (0 is kept for a missing value)

A dynamic table (schema ``kind = "dynamic"``) keeps the whole hash instead: ``id = h`` read as
an int64 (negative values included), 0 still missing, and a value whose ``h`` is 0 gets id 1.

A categorical feature with ``encoding = "hex32"`` (the Criteo presets) reads a value of exactly
8 hex digits (either case) as an unsigned 32-bit integer v and uses ``h = splitmix64(v)``
instead: the ids ``recsync data criteo`` has always given. Any other value of such a feature
falls back to the text hash above, field by field.

Everything is defined on bytes and 64-bit wrap-around arithmetic, so the ids are the same on
every machine, numpy and pyarrow version; tests/unit/test_value_hash.py pins known values so it
can never change silently. A value is hashed as text: the CSV field exactly as written (``7``
and ``7.0`` differ), a Parquet integer as its decimal text (so Parquet and CSV agree).

Speed: one numpy pass per byte position over all values of a column at once (no Python call per
value), about 15 ns per 8-byte value on one core; numpy releases the GIL, so the converter's two
threads hash two blocks at once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recsync.data.hashing import splitmix64

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_FEW = 32  # long values still going: finished in Python, not a numpy pass per byte position


def _fnv_matrix(h: np.ndarray, rows: np.ndarray) -> None:
    """Fold the bytes of ``rows`` ([n, k] uint8, one value per row) into ``h`` in place."""
    for j in range(rows.shape[1]):
        h ^= rows[:, j]
        h *= FNV_PRIME


def _fnv_rows(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of ``data[starts[i] : starts[i] + lengths[i]]`` for every i: the values of a
    whole column, as Arrow packs them (in order, back to back; a value of length 0 may own
    bytes), not a selection of them."""
    n = len(starts)
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h
    hi = int(lengths.max())
    if hi == 0:
        return h
    if hi > 256:  # long text: rows sorted by length, so the rows still going are a prefix
        order = np.argsort(-lengths, kind="stable")
        s, ls = starts[order], lengths[order]
        ends, c = ls.tolist(), n  # rows [0, c): those with length > j
        for j in range(hi):
            while c and ends[c - 1] <= j:
                c -= 1
            if c <= _FEW:  # ~0.1 us a byte, where a numpy pass costs ~4 us: a 64 MB value takes
                for r in range(c):  # seconds, not minutes
                    h[r] = _fnv_tail(int(h[r]), data[s[r] + j:s[r] + ls[r]].tobytes())
                break
            h[:c] ^= data[s[:c] + j]
            h[:c] *= FNV_PRIME
        out = np.empty(n, dtype=np.uint64)
        out[order] = h
        return out
    # One group per length (ids usually have one or a few lengths). A group holding every
    # non-empty value is usually one contiguous [m, k] block of the data (Arrow packs values
    # back to back; empty and null ones take no bytes): a strided view, no gather.
    nonempty = int(np.count_nonzero(lengths))
    if int(np.count_nonzero(lengths == hi)) == nonempty:  # one length (and empty ones)
        counts = {hi: nonempty}
    else:
        counts = np.bincount(lengths, minlength=hi + 1)
        counts = {int(k): int(counts[k]) for k in np.flatnonzero(counts[1:]) + 1}
    for k in counts:
        first = int(starts[0])
        if counts[k] == n:
            _fnv_matrix(h, data[first:first + n * k].reshape(n, k))
            continue
        sel = lengths == k
        if counts[k] == nonempty:
            first = int(starts[np.argmax(sel)])
            last = int(starts[n - 1 - np.argmax(sel[::-1])])
            if last - first == (nonempty - 1) * k:  # (a null may own bytes: then it is not)
                sub = np.full(nonempty, FNV_OFFSET, dtype=np.uint64)
                _fnv_matrix(sub, data[first:first + nonempty * k].reshape(nonempty, k))
                h[sel] = sub
                continue
        idx = np.flatnonzero(sel)
        sub = np.full(len(idx), FNV_OFFSET, dtype=np.uint64)
        _fnv_matrix(sub, data[starts[idx, None] + np.arange(k)])
        h[idx] = sub
    return h


def _fnv_tail(h: int, data: bytes) -> int:
    """FNV-1a 64 state ``h`` after folding in ``data``."""
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def valid_mask(values: pa.Array) -> np.ndarray:
    """bool [n]: not null (from the validity bitmap: faster than is_null())."""
    bitmap = values.buffers()[0]
    if bitmap is None or values.null_count == 0:
        return np.ones(len(values), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return bits[values.offset:values.offset + len(values)].view(bool)


def hash_text(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 hash (FNV-1a 64 then splitmix64) of each value's text, bool mask of the values
    present: not null and not empty). A missing value's hash is arbitrary. ``values``: text
    (string, binary or their large forms: the bytes are hashed), or integers (hashed as their
    decimal text)."""
    data, starts, lengths = _text_buffers(values)
    return splitmix64(_fnv_rows(data, starts, lengths)), lengths > 0


def hash_hex32(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hash_text` for a feature with ``encoding = "hex32"``: a value of 8 hex digits
    hashes as its 32-bit integer, any other as its text."""
    data, starts, lengths = _text_buffers(values)
    ok, h = _hex32(data, starts, lengths)
    text = ~ok & (lengths > 0)
    if text.any():  # (the whole column: _fnv_rows reads values packed as Arrow packs them)
        h[text] = _fnv_rows(data, starts, np.where(text, lengths, 0))[text]
    return splitmix64(h), lengths > 0


def hex32_values(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(bool: exactly 8 hex digits, uint64: their value there, arbitrary elsewhere) per value:
    the values a feature with ``encoding = "hex32"`` hashes as integers."""
    return _hex32(*_text_buffers(values))


def _hex32(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    eight = np.flatnonzero(lengths == 8)
    words = data[starts[eight, None] + np.arange(8)].view("<u8").reshape(-1)
    ok = np.zeros(len(lengths), dtype=bool)
    ok[eight], v = hex32_words(words, lengths[eight])
    h = np.empty(len(lengths), dtype=np.uint64)
    h[eight] = v
    return ok, h


def _text_buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, start and length of each value; 0 for a null) of a text or integer column."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    t = values.type
    if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t)):
        values = pc.cast(values, pa.string())
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()
    large = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    off_type = np.int64 if large else np.int32
    offsets = np.frombuffer(offsets_buf, dtype=off_type)[values.offset:values.offset + n + 1]
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, dtype=np.uint8))
    lengths = np.diff(offsets)
    if values.null_count:
        lengths[~valid_mask(values)] = 0  # a null's bytes, if any, are not its value
    return data, offsets[:-1], lengths


_ONES, _HIGH, _NIB = 0x0101010101010101, 0x8080808080808080, 0x0F0F0F0F0F0F0F0F
_U = np.uint64


def hex32_words(w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ok: exactly 8 hex digits, uint64 value) of fields from their little-endian 8-byte
    windows ``w`` and lengths ``n``, all at once (SWAR: every byte of a word in one step)."""
    dig = w + _U(0x50 * _ONES)  # (in place where it can: fewer temporaries, same answer)
    t = w + _U(0x46 * _ONES)
    dig &= ~t  # 0x30 <= c <= 0x39
    np.bitwise_or(w, _U(0x20 * _ONES), out=t)
    alpha = t + _U(0x1F * _ONES)
    t += _U(0x19 * _ONES)
    alpha &= ~t  # 0x61 <= c | 0x20 <= 0x66
    dig |= alpha
    dig &= _U(_HIGH)
    dig ^= _U(_HIGH)
    np.bitwise_and(w, _U(_HIGH), out=t)
    dig |= t  # a byte >= 0x80 is no digit
    ok = dig == 0
    ok &= n == 8
    v = w >> _U(6)  # nibbles, byte 0 the highest
    v &= _U(_ONES)
    v *= _U(9)
    np.bitwise_and(w, _U(_NIB), out=t)
    v += t
    v = ((v & _U(0x000F000F000F000F)) << _U(4)) | ((v >> _U(8)) & _U(0x000F000F000F000F))
    v = ((v & _U(0x000000FF000000FF)) << _U(8)) | ((v >> _U(16)) & _U(0x000000FF000000FF))
    v = ((v & _U(0xFFFF)) << _U(16)) | ((v >> _U(32)) & _U(0xFFFF))
    return ok, v


def to_ids(hashes: np.ndarray, rows: int | None, present: np.ndarray | None = None
           ) -> np.ndarray:
    """int64 ids ``1 + hash % (rows - 1)`` of a fixed table, or with ``rows`` None those of a
    dynamic table (:func:`dynamic_ids`); 0 where ``present`` is False (missing values)."""
    if rows is None:
        return dynamic_ids(hashes, present)
    if rows < 2:
        raise ValueError(f"a hashed table needs at least 2 rows (row 0 is 'missing'), got {rows}")
    ids = hashes % np.uint64(rows - 1)
    ids += np.uint64(1)
    if present is not None:
        ids[~present] = 0
    return ids.view(np.int64)


def dynamic_ids(hashes: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
    """int64 ids of a dynamic table: the full 64-bit hash read as an int64 (so half of them
    are negative); 0 where ``present`` is False. A hash of 0 becomes id 1, since 0 means
    missing: the one place two values may share an id, a chance of 1 in 2^64 per value."""
    ids = hashes.astype(np.uint64, copy=True).view(np.int64)
    ids[ids == 0] = 1
    if present is not None:
        ids[~present] = 0
    return ids


def ids_of(values: pa.Array, rows: int | None, encoding: str = "text") -> np.ndarray:
    """Row ids of a column of values (text or integers): null or empty text -> 0; ``rows``
    None: a dynamic table's ids (the full hash)."""
    h, present = (hash_hex32 if encoding == "hex32" else hash_text)(values)
    return to_ids(h, rows, present)


def hash_one(text: str) -> int:
    """The hash of one value, written out byte by byte: the reference the tests hold the
    vectorised version to."""
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return int(splitmix64(np.array([h], dtype=np.uint64))[0])
