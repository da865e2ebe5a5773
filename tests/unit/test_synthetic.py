"""Synthetic generator: determinism, layout, CTR, Zipf skew, Bayes metrics, overwrite rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from recsync.data import synthetic
from recsync.data.format import NUM_DENSE, NUM_TABLES, part_paths
from recsync.data.synthetic import (CRITEO_KAGGLE_CARDINALITIES, SynthSpec, generate,
                                    generate_chunk)

SPEC = SynthSpec(seed=3, max_table_rows=1000)
CHUNK = 700  # rows per generated chunk in these tests, so that every split has several parts


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(synthetic, "CHUNK_ROWS", CHUNK)


def gen(out, rows=2000, eval_rows=1500, spec=SPEC, processes=1, **kw):
    return generate(out, rows=rows, eval_rows=eval_rows, spec=spec, processes=processes,
                    progress=False, **kw)


def load_split(root, split):
    """(dense, sparse, label) of a split, concatenated in meta.json's part order."""
    meta = json.loads((root / "meta.json").read_text())
    parts = [{k: np.load(p, allow_pickle=False) for k, p in
              part_paths(root / split, info["name"]).items()}
             for info in meta["splits"][split]["parts"]]
    return tuple(np.concatenate([p[k] for p in parts]) for k in ("dense", "sparse", "label"))


def all_files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*.npy"))}


# ------------------------------------------------------------------------------------ determinism

def test_same_seed_same_bytes_whatever_the_process_count(tmp_path):
    gen(tmp_path / "a", processes=1)
    gen(tmp_path / "b", processes=2)
    a, b = all_files(tmp_path / "a"), all_files(tmp_path / "b")
    assert len(a) == 3 * (3 + 3)  # 2000 and 1500 rows in 700-row chunks: 3 parts per split
    assert a == b
    meta_a = json.loads((tmp_path / "a" / "meta.json").read_text())
    meta_b = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta_a == meta_b


def test_parts_are_the_chunks_generate_chunk_returns(tmp_path):
    gen(tmp_path, rows=1000, eval_rows=800)
    for split_i, (split, rows) in enumerate((("train", 1000), ("eval", 800))):
        dense, sparse, label = load_split(tmp_path, split)
        expected = [generate_chunk(SPEC, split_i, c, min(CHUNK, rows - c * CHUNK))
                    for c in range(2)]
        np.testing.assert_array_equal(dense, np.concatenate([e[0] for e in expected]))
        np.testing.assert_array_equal(sparse, np.concatenate([e[1] for e in expected]))
        np.testing.assert_array_equal(label, np.concatenate([e[2] for e in expected]))


def test_generate_chunk_is_deterministic():
    a = generate_chunk(SPEC, 0, 5, 300)
    b = generate_chunk(SPEC, 0, 5, 300)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_different_seeds_splits_and_chunks_differ():
    base = generate_chunk(SPEC, 0, 0, 300)
    others = [generate_chunk(SynthSpec(seed=4, max_table_rows=1000), 0, 0, 300),
              generate_chunk(SPEC, 1, 0, 300),   # the eval split's first chunk
              generate_chunk(SPEC, 0, 1, 300)]   # the next train chunk
    for other in others:
        assert not np.array_equal(base[0], other[0])
        assert not np.array_equal(base[1], other[1])


def test_different_seeds_give_different_data_sets(tmp_path):
    gen(tmp_path / "a", rows=500, eval_rows=100)
    gen(tmp_path / "b", rows=500, eval_rows=100, spec=SynthSpec(seed=4, max_table_rows=1000))
    a, b = load_split(tmp_path / "a", "train"), load_split(tmp_path / "b", "train")
    assert not np.array_equal(a[0], b[0])
    assert not np.array_equal(a[1], b[1])


# ------------------------------------------------------------------------------------ layout

def test_shapes_dtypes_and_meta(tmp_path):
    report = gen(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["format"] == "recsync-ctr" and meta["version"] == 2
    assert meta["num_dense"] == NUM_DENSE
    assert len(meta["tables"]) == NUM_TABLES == 26
    rows = [t["rows"] for t in meta["tables"]]
    assert rows == [min(c, 1000) for c in CRITEO_KAGGLE_CARDINALITIES]
    assert max(rows) == 1000 and min(rows) == 3  # capped big tables and small real ones mix
    assert [t["name"] for t in meta["tables"]] == [f"C{i}" for i in range(1, 27)]
    assert meta["splits"]["train"]["rows"] == 2000 == report.train_rows
    assert meta["splits"]["eval"]["rows"] == 1500 == report.eval_rows
    assert [p["rows"] for p in meta["splits"]["train"]["parts"]] == [700, 700, 600]
    assert meta["source"]["kind"] == "synthetic"
    assert meta["source"]["spec"]["max_table_rows"] == 1000
    assert meta["source"]["spec"]["seed"] == 3
    for split, n in (("train", 2000), ("eval", 1500)):
        part = part_paths(tmp_path / split, "part-00000")
        dense, sparse, label = (np.load(part[k]) for k in ("dense", "sparse", "label"))
        assert dense.dtype == np.float32 and dense.shape == (700, NUM_DENSE)
        assert sparse.dtype == np.int32 and sparse.shape == (700, NUM_TABLES)
        assert label.dtype == np.float32 and label.shape == (700,)
        dense, sparse, label = load_split(tmp_path, split)
        assert len(label) == n
        assert set(np.unique(label)) <= {0.0, 1.0}
        assert np.isfinite(dense).all() and (dense >= 0).all()  # log(1 + max(x, 0))
        assert (sparse >= 0).all()
        assert (sparse < np.array(rows)[None, :]).all()


def test_default_eval_rows_is_a_tenth(tmp_path):
    r = generate(tmp_path, rows=1000, spec=SPEC, processes=1, progress=False)
    assert r.eval_rows == 100
    assert json.loads((tmp_path / "meta.json").read_text())["splits"]["eval"]["rows"] == 100


def test_ctr_is_near_target():
    for target in (0.25, 0.1):
        spec = SynthSpec(seed=1, max_table_rows=1000, target_ctr=target)
        _, _, label, prob = generate_chunk(spec, 0, 0, 100_000)
        assert abs(label.mean() - target) < 0.02
        assert abs(prob.mean() - target) < 0.02


def test_ids_are_zipf_skewed():
    _, ids, _, _ = generate_chunk(SPEC, 0, 0, 100_000)
    t = CRITEO_KAGGLE_CARDINALITIES.index(10131227)  # C3: capped at 1000 rows
    counts = np.bincount(ids[:, t], minlength=1000)
    assert counts.max() > 50 * np.median(counts)
    assert counts.max() > 0.05 * len(ids)  # the head id alone is several percent of the rows
    # hot ids are scattered over the table, not the lowest ids
    assert np.argsort(counts)[-10:].max() > 100


def test_labels_carry_signal():
    _, _, label, prob = generate_chunk(SPEC, 1, 0, 20_000)
    assert roc_auc_score(label, prob) > 0.75


# ------------------------------------------------------------------------------------ Bayes metrics

def test_meta_holds_bayes_metrics_of_the_eval_split(tmp_path):
    report = gen(tmp_path, rows=500, eval_rows=1500)
    meta = json.loads((tmp_path / "meta.json").read_text())
    chunks = [generate_chunk(SPEC, 1, c, n) for c, n in enumerate((700, 700, 100))]
    y = np.concatenate([c[2] for c in chunks])
    p = np.concatenate([c[3] for c in chunks]).astype(np.float64)
    auc, ll = roc_auc_score(y, p), log_loss(y, p, labels=[0, 1])
    syn = meta["synthetic"]
    assert syn["bayes_auc"] == pytest.approx(auc, rel=1e-12)
    assert syn["bayes_logloss"] == pytest.approx(ll, rel=1e-12)
    assert syn["eval_ctr"] == pytest.approx(y.mean())
    assert report.bayes_auc == pytest.approx(auc, rel=1e-12)
    assert report.bayes_logloss == pytest.approx(ll, rel=1e-12)
    # and the eval labels on disk are the ones scored
    np.testing.assert_array_equal(load_split(tmp_path, "eval")[2], y)


# ------------------------------------------------------------------------------------ overwrite

def test_refuses_to_overwrite(tmp_path):
    gen(tmp_path, rows=500, eval_rows=100)
    before = all_files(tmp_path)
    with pytest.raises(FileExistsError, match="overwrite"):
        gen(tmp_path, rows=500, eval_rows=100, spec=SynthSpec(seed=9, max_table_rows=1000))
    assert all_files(tmp_path) == before
    assert (tmp_path / "meta.json").is_file()


def test_overwrite_replaces_and_removes_stale_parts(tmp_path):
    gen(tmp_path, rows=2000, eval_rows=1500)   # 3 parts per split
    assert (tmp_path / "train" / "part-00002.label.npy").exists()
    gen(tmp_path, rows=500, eval_rows=100, overwrite=True)  # 1 part per split
    names = sorted(p.name for p in tmp_path.rglob("*.npy"))
    assert names == sorted(f"part-00000.{k}.npy" for k in ("dense", "sparse", "label")
                           for _ in range(2))
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["splits"]["train"]["rows"] == 500
    assert len(load_split(tmp_path, "train")[2]) == 500


@pytest.mark.parametrize("kw, match", [
    (dict(rows=0), "rows"),
    (dict(eval_rows=0), "eval_rows"),
    (dict(spec=SynthSpec(max_table_rows=1)), "max_table_rows"),
    (dict(spec=SynthSpec(max_table_rows=1000, target_ctr=0.0)), "target_ctr"),
    (dict(spec=SynthSpec(max_table_rows=1000, target_ctr=1.5)), "target_ctr"),
    (dict(spec=SynthSpec(max_table_rows=1000, zipf_exponent=1.0)), "zipf_exponent"),
    (dict(spec=SynthSpec(max_table_rows=1000, zipf_exponent=-0.5)), "zipf_exponent"),
])
def test_bad_arguments_raise_value_error(tmp_path, kw, match):
    args = dict(rows=500, eval_rows=100) | kw
    with pytest.raises(ValueError, match=match):
        gen(tmp_path / "out", **args)


def test_bad_arguments_leave_an_existing_data_set_alone(tmp_path):
    gen(tmp_path, rows=500, eval_rows=100)
    before = all_files(tmp_path)
    with pytest.raises(ValueError, match="target_ctr"):
        gen(tmp_path, rows=500, eval_rows=100, overwrite=True,
            spec=SynthSpec(max_table_rows=1000, target_ctr=2.0))
    assert (tmp_path / "meta.json").is_file()
    assert all_files(tmp_path) == before
