"""Scenario `dynamic`'s parts (no Ray): the data sets derived from one synthetic data set, bytes
per row measured on the store's arrays, the drift's memory arithmetic. The scenario's own run
takes over 30 s at its smallest scale (20 batches of 4,096 per arm), so it has no smoke test
here: `recsync bench dynamic --scale 0.05 --seeds 1` runs it in about 40 s.

    PYTHONPATH=. python -m pytest -q -p no:xdist tests/unit/test_bench_dynamic.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from recsync.bench import dynamic_data as dd
from recsync.bench import dynamic_drift as dr
from recsync.bench import dynamic_store as ds
from recsync.data.hashing import splitmix64
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.embedding.id_map import IdMap

ROWS = 50  # a fixed table's rows in the derived data


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    root = tmp_path_factory.mktemp("dyn") / "teacher"
    generate(root, rows=3000, eval_rows=700, progress=False, processes=1,
             spec=SynthSpec(max_table_rows=10 * ROWS))
    return root


def _arrays(root, split, kind):
    meta = json.loads((root / "meta.json").read_text())
    return np.concatenate([np.load(root / split / f"{p['name']}.{kind}.npy")
                           for p in meta["splits"][split]["parts"]])


def test_fixed_ids_are_hashed_into_rows_as_a_conversion_does_and_the_rest_is_unchanged(
        teacher, tmp_path):
    fixed = dd.derive(teacher, tmp_path / "fixed", rows=ROWS)
    for split in ("train", "eval"):
        ids = _arrays(teacher, split, "sparse")
        got = _arrays(fixed, split, "sparse")
        assert got.dtype == np.int32
        want = 1 + splitmix64(ids.astype(np.uint64)) % np.uint64(ROWS - 1)
        np.testing.assert_array_equal(got, want.astype(np.int32))
        assert got.min() >= 1 and got.max() < ROWS
        for kind in ("dense", "label"):
            np.testing.assert_array_equal(_arrays(fixed, split, kind),
                                          _arrays(teacher, split, kind))
    meta = json.loads((fixed / "meta.json").read_text())
    assert meta["id_dtype"] == "int32"
    assert all(t["rows"] == ROWS and "kind" not in t for t in meta["tables"])
    src = json.loads((teacher / "meta.json").read_text())
    assert meta["splits"] == src["splits"] and meta["synthetic"] == src["synthetic"]
    d = Dataset(fixed)  # the reader checks ids against [0, rows)
    batch = d.read(d.chunks("train", 1000)[0])
    assert not any(t.dynamic for t in d.layout.tables)
    np.testing.assert_array_equal(batch.label.numpy(), _arrays(teacher, "train", "label")[:1000])


def test_dynamic_ids_are_the_full_hashes_and_meta_says_dynamic_int64(teacher, tmp_path):
    dyn = dd.derive(teacher, tmp_path / "dyn", rows=ROWS, dynamic=True)
    ids = _arrays(teacher, "train", "sparse")
    got = _arrays(dyn, "train", "sparse")
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, splitmix64(ids.astype(np.uint64)).view(np.int64))
    assert (got < 0).any() and not (got == 0).any()  # about half negative, none missing
    for t in range(ids.shape[1]):  # a bijection: one id per teacher id
        assert len(np.unique(got[:, t])) == len(np.unique(ids[:, t]))
    meta = json.loads((dyn / "meta.json").read_text())
    assert meta["id_dtype"] == "int64"
    assert all(t["kind"] == "dynamic" and t["rows"] == ROWS for t in meta["tables"])
    d = Dataset(dyn)
    assert all(t.dynamic for t in d.layout.tables)
    batch = d.read(d.chunks("eval", 10_000)[0])
    np.testing.assert_array_equal(batch.sparse.numpy(), _arrays(dyn, "eval", "sparse"))
    np.testing.assert_array_equal(batch.label.numpy(), _arrays(teacher, "eval", "label"))


def test_a_hash_of_zero_becomes_id_one_and_a_fixed_table_needs_two_rows(monkeypatch):
    ids = np.array([[7, 8]], dtype=np.int64)
    monkeypatch.setattr(dd, "splitmix64", lambda x: np.zeros_like(x))
    np.testing.assert_array_equal(dd.hashed_ids(ids, rows=ROWS, dynamic=True), [[1, 1]])
    with pytest.raises(ValueError, match="rows >= 2"):
        dd.hashed_ids(ids, rows=1, dynamic=False)


def test_each_drift_segment_has_new_ids_and_eval_takes_the_last_segments(teacher, tmp_path):
    drift = dd.derive(teacher, tmp_path / "drift", rows=ROWS, dynamic=True, segments=3)
    ids = _arrays(teacher, "train", "sparse").astype(np.uint64)
    got = _arrays(drift, "train", "sparse")
    n = len(ids)
    seg = np.arange(n) * 3 // n
    for k in range(3):
        want = splitmix64(ids[seg == k] + np.uint64(k * dd.SEGMENT_STRIDE)).view(np.int64)
        np.testing.assert_array_equal(got[seg == k], want)
    for t in range(ids.shape[1]):  # segments share no id
        a, b = (set(got[seg == k, t].tolist()) for k in (0, 2))
        assert not a & b
    evl = _arrays(teacher, "eval", "sparse").astype(np.uint64)
    np.testing.assert_array_equal(
        _arrays(drift, "eval", "sparse"),
        splitmix64(evl + np.uint64(2 * dd.SEGMENT_STRIDE)).view(np.int64))
    counts = dd.id_counts(drift)
    plain = dd.id_counts(dd.derive(teacher, tmp_path / "dyn", rows=ROWS, dynamic=True))
    assert all(d > p for d, p in zip(counts["train"], plain["train"]) if p > 1)
    f = counts["first_seen"][2]  # sorted first rows of each distinct id
    assert len(f) == counts["train"][2] and (np.diff(f) > 0).all() and f[0] == 0
    with pytest.raises(ValueError, match="only with dynamic"):
        dd.derive(teacher, tmp_path / "bad", rows=ROWS, segments=2)


def test_bytes_per_row_are_the_stores_arrays():
    fixed = ds.bytes_per_row(4096, dynamic=False)
    assert fixed["bytes_per_row"] == (16 + 1) * 4 + 1  # weights, Adagrad state, flag
    dyn = ds.bytes_per_row(4096, dynamic=True)
    assert dyn["parts_per_row"]["id_map"] == pytest.approx(IdMap.bytes_per_row(4096))
    assert dyn["parts_per_row"]["admission"] == 0  # admit_after 1 holds no sketch
    assert dyn["bytes_per_row"] == pytest.approx(fixed["bytes_per_row"]
                                                 + IdMap.bytes_per_row(4096))
    sketch = ds.bytes_per_row(1 << 16, dynamic=True, admit_after=2)
    assert sketch["parts_per_row"]["admission"] == pytest.approx(2.0)  # 4 rows of cap / 4
    capacity, f, d = ds.equal_memory_capacity(10_000)
    assert capacity * d["bytes_per_row"] <= 10_000 * f["bytes_per_row"]
    assert (capacity + 1) * d["bytes_per_row"] > 10_000 * f["bytes_per_row"]


def test_tables_are_full_when_they_hold_a_share_of_the_rows_they_end_with():
    # capacity 3: table 0 holds rows that came at 0, 3, 9; table 1 at 0, 5; table 2 at 0, 1, 2
    first_seen = [np.array([0, 3, 9, 20]), np.array([0, 5]), np.array([0, 1, 2, 30, 31])]
    assert dr.full_row(first_seen, 3, share=1.0) == 9  # all 8 rows
    assert dr.full_row(first_seen, 3) == 5  # 80%: 7 of the 8
    assert dr.full_row(first_seen, 3, share=0.5) == 1  # 4 of the 8
    assert dr.full_row(first_seen, 5) is None  # no table outgrows 5
    # from row 3 on: table 0 takes the ids of rows 3 and 9 (then is full), table 1 row 5's
    assert dr.rows_after(first_seen, 3, 3) == 2 + 1
    assert dr.rows_after(first_seen, 3, 100) == 3 + 1 + 2  # unbounded: rows 20, 30, 31 too


def test_memory_over_run_takes_medians_over_windows_of_training():
    mb = dr.MB
    samples = [0, 10, 10, 20, 50, 60, 60, 70, 80, 90, 100, 100, 100]
    anon = [5, 40, 41, 42, 50, 60, 62, 61, 70, 71, 72, 300, 400]  # from the 2nd 100: eval
    series = [(float(i), n, (a + 100) * mb, a * mb) for i, (n, a) in enumerate(zip(samples,
                                                                                   anon))]
    m = dr.memory_over_run(series, total=100, full_at=50)
    assert m["at_training_fraction_mb"]["0%"]["anon"] == 40.5  # samples 1-10: 40, 41
    assert m["at_training_fraction_mb"]["50%"]["anon"] == 50  # samples 40-50
    assert m["end_mb"] == {"rss": 171.5, "anon": 71.5}  # samples 90-100 of training: 71, 72
    assert m["growth_after_full_mb"]["anon"] == 71.5 - 60  # samples 50-60: 50, 60, 62
    assert m["full_at_fraction"] == 0.5
    assert m["peak_anon_mb"] == 400
    assert "growth_after_full_mb" not in dr.memory_over_run(series, total=100, full_at=None)
