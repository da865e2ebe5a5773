"""One buffer each way per PS call (recsync/ps/wire.py): what is packed comes back as it was."""

from __future__ import annotations

import numpy as np

from recsync.ps import wire


def test_ids_and_rows_come_back_as_views_of_one_buffer():
    ids = [np.array([3, 1, 4], np.int64), np.empty(0, np.int64), np.array([9], np.int64)]
    rows = [np.arange(6, dtype=np.float32).reshape(3, 2), np.empty((0, 4), np.float32),
            np.full((1, 4), 7, np.float32)]
    for arrays, dtype in ((ids, np.int64), (rows, np.float32)):
        packed = wire.pack(arrays, dtype)
        assert packed[0].dtype == dtype and packed[0].ndim == 1  # one buffer
        back = wire.unpack(packed)
        assert [b.shape for b in back] == [a.shape for a in arrays]
        assert all(np.array_equal(a, b) for a, b in zip(arrays, back))
        assert all(b.base is packed[0] or b.size == 0 for b in back)  # views, not copies


def test_no_tables_and_a_float64_gradient_are_packed_as_float32():
    assert wire.unpack(wire.pack([], np.int64)) == []
    back = wire.unpack(wire.pack([np.array([[0.5, 1.5]])], np.float32))
    assert back[0].dtype == np.float32 and back[0].tolist() == [[0.5, 1.5]]
