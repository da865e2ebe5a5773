"""The categorical value hash (recsync/data/value_hash.py): pinned values, so that ids can never
change silently, and the vectorised version held to the byte-by-byte reference.

    PYTHONPATH=. python -m pytest -q tests/unit/test_value_hash.py
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from recsync.data.value_hash import _fnv_rows, hash_one, hash_text, ids_of, to_ids


@pytest.mark.parametrize("text, fnv", [("", 0xCBF29CE484222325), ("a", 0xAF63DC4C8601EC8C),
                                       ("foobar", 0x85944171F73967E8)])
def test_fnv1a64_published_vectors(text, fnv):
    data = np.frombuffer(text.encode() or b"x", dtype=np.uint8)
    assert int(_fnv_rows(data, np.array([0]), np.array([len(text)]))[0]) == fnv


# If one of these changes, every converted data set's ids change: never edit them.
PINNED = [("a", 6857225946766476583, 280583), ("68fd1e64", 3575023389036567113, 531177),
          ("1005", 403444828829963052, 195328), ("Comedy", 8955424792079906952, 654466),
          ("héllo", 4618853872117778681, 269658)]


@pytest.mark.parametrize("text, h, row", PINNED)
def test_pinned_values(text, h, row):
    assert hash_one(text) == h
    got, present = hash_text(pa.array([text]))
    assert int(got[0]) == h and present[0]
    assert int(ids_of(pa.array([text]), 1_000_000)[0]) == row == 1 + h % 999_999


def _check(arr: pa.Array) -> None:
    h, present = hash_text(arr)
    for i, v in enumerate(arr.to_pylist()):
        text = v.decode() if isinstance(v, bytes) else (None if v is None else str(v))
        if text:
            assert int(h[i]) == hash_one(text), (i, v)
        assert present[i] == bool(text)


def test_vectorised_equals_reference():
    rng = np.random.default_rng(0)
    hexes = [f"{x:08x}" for x in rng.integers(0, 2**32, 500)]
    _check(pa.array(hexes))
    _check(pa.array([h if i % 7 else None for i, h in enumerate(hexes)]))  # nulls
    _check(pa.array([h if i % 5 else "" for i, h in enumerate(hexes)]))  # empty text
    _check(pa.array([str(x) for x in rng.integers(0, 10**6, 500)]))  # several lengths
    _check(pa.array(["a" * 300, "bb", None, "x" * 257, "é", ""] * 3))  # long text
    _check(pa.array([h.encode() for h in hexes], pa.binary()))
    _check(pa.array(hexes, pa.large_string()))
    _check(pa.array(hexes).slice(7, 100))
    _check(pa.array([h if i % 3 else None for i, h in enumerate(hexes)]).slice(5, 200))
    a = pa.array(hexes[:60])  # nulls that still own bytes in the data buffer
    _check(pc.if_else(pa.array([i % 3 > 0 for i in range(60)]), a, pa.scalar(None, pa.string())))


def test_integers_hash_as_their_text():
    ints = pa.array([7, 1005, None, -3])
    h, present = hash_text(ints)
    assert int(h[1]) == hash_one("1005") and int(h[3]) == hash_one("-3")
    assert present.tolist() == [True, True, False, True]
    assert (ids_of(ints, 100)[[0, 1, 3]] == ids_of(pa.array(["7", "1005", "-3"]), 100)).all()


def test_ids_range_and_missing():
    ids = ids_of(pa.array([f"v{i}" for i in range(10_000)] + [None, ""]), 50)
    assert ids[:-2].min() >= 1 and ids[:-2].max() <= 49 and ids[-2:].tolist() == [0, 0]
    with pytest.raises(ValueError, match="at least 2 rows"):
        to_ids(np.zeros(1, np.uint64), 1)
