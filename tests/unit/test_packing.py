"""Many arrays as one on the direct data path (ps/packing.py): what crosses, and that the
receiver gets the same arrays back."""

from __future__ import annotations

import pickle
import struct

import numpy as np

from recsync.embedding.row_optim import RowSGD
from recsync.embedding.store import EmbeddingStore, RowViews
from recsync.embedding.spec import TableSpec
from recsync.ps.channel import HEADER, decode, encode
from recsync.ps.packing import pack


def crossed(obj):
    """(what the receiver decodes, the number of out-of-band buffers that crossed)."""
    parts = encode(0, obj)
    _, size, count, slot = HEADER.unpack(parts[0])
    lengths = struct.unpack(f"<{count}Q", parts[1])
    body = b"".join(bytes(memoryview(p).cast("B")) for p in parts[2:])
    return decode(memoryview(bytearray(body)), size, lengths), count


def test_a_list_of_arrays_of_one_row_shape_crosses_as_one_buffer_and_arrives_whole():
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 100, n).astype(np.int64) for n in (5, 0, 300, 1)]
    grads = [rng.random((n, 4), dtype=np.float32) for n in (5, 0, 300, 1)]
    (verb, (got_ids, got_grads, meta)), count = crossed(("push", (ids, grads, {"k": 1})))
    assert verb == "push" and meta == {"k": 1} and count == 2  # one for ids, one for grads
    for got, sent in zip(got_ids + got_grads, ids + grads):
        assert got.dtype == sent.dtype and got.shape == sent.shape and np.array_equal(got, sent)


def test_lists_that_cannot_be_one_array_cross_as_they_are():
    mixed_dims = [np.zeros((2, 4), np.float32), np.ones((3, 8), np.float32)]
    mixed_types = [np.zeros(2, np.int64), np.ones(2, np.float32)]
    not_arrays = [np.zeros(2), "x", 3]
    (a, b, c), count = crossed((mixed_dims, mixed_types, not_arrays))
    assert count == 5
    assert [x.shape for x in a] == [(2, 4), (3, 8)] and b[1].dtype == np.float32
    assert c[1:] == ["x", 3] and np.array_equal(c[0], np.zeros(2))


def test_a_stores_pulled_rows_cross_as_their_one_gather_without_a_copy():
    tables = [TableSpec(f"t{t}", 50, 4) for t in range(3)]
    store = EmbeddingStore(tables, RowSGD(lr=0.1), seed=0, init_scale=0.1)
    ids = [np.array([1, 7], np.int64), np.array([3], np.int64), np.array([0, 49, 9], np.int64)]
    rows = store.pull_arrays(ids)
    assert isinstance(rows, RowViews)
    raws = []
    pickle.dumps(pack(rows), protocol=5, buffer_callback=lambda b: raws.append(b.raw()))
    assert len(raws) == 1
    assert np.frombuffer(raws[0], np.uint8).ctypes.data == rows.flat.ctypes.data  # no copy
    (got,), _ = crossed((rows,))
    assert [g.tolist() for g in got] == [r.tolist() for r in rows]
    rows[1] = np.full((1, 4), 7.0, np.float32)  # replaced: no longer parts of its gather
    (got,), _ = crossed((rows,))
    assert got[1].tolist() == [[7.0] * 4] and got[2].tolist() == rows[2].tolist()


def test_pulled_rows_pickle_as_a_plain_list_outside_the_direct_path():
    rows = RowViews([np.zeros((1, 2))], np.zeros((1, 2)), [0, 1])
    again = pickle.loads(pickle.dumps(rows))
    assert type(again) is list and again[0].shape == (1, 2)
