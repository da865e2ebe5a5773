"""Format version 2 and its lookups: multi-hot features (values + offsets) pooled exactly as
torch.nn.EmbeddingBag, forward and backward; shared tables; weights; int64 ids; version 1 data
sets read as their version 2 layout. Run: pytest -q tests/unit/test_multi_hot.py"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from recsync.data.format import (DataFormatError, Feature, Layout, SplitWriter, Table,
                                 part_paths, write_meta)
from recsync.data.reader import Batch, Dataset
from recsync.embedding.lookup import LocalLookup, LookupPlan
from recsync.embedding.row_optim import RowSGD
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore, initial_rows

LAYOUT = Layout(dense=("x", "y"),
                features=(Feature("user", "user"), Feature("tags", "tag", "sum", 5),
                          Feature("item", "item"), Feature("history", "item", "mean", 4)),
                tables=(Table("user", 30), Table("tag", 12), Table("item", 50, dim=3)),
                weight=True)


def ragged(rng, n: int, rows: int, max_len: int):
    lengths = rng.integers(0, max_len + 1, n)  # empty lists included
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return rng.integers(0, rows, int(offsets[-1])).astype(np.int64), offsets


def rows_of(rng, n: int, start: int):
    dense = np.stack([np.arange(start, start + n), rng.random(n)], 1).astype(np.float32)
    sparse = np.stack([rng.integers(0, 30, n), rng.integers(0, 50, n)], 1)
    label = (rng.random(n) < 0.3).astype(np.float32)
    weight = rng.random(n).astype(np.float32) + 0.5
    return dense, sparse, label, weight, [ragged(rng, n, 12, 5), ragged(rng, n, 50, 4)]


def make_dataset(root, train=90, eval_rows=20, part_rows=40):
    rng = np.random.default_rng(0)
    splits, written = {}, {}
    for split, n in (("train", train), ("eval", eval_rows)):
        w = SplitWriter(root, split, layout=LAYOUT, part_rows=part_rows)
        pieces = [rows_of(rng, min(33, n - s), s) for s in range(0, n, 33)]
        for p in pieces:
            w.write(*p[:4], multi=p[4])
        splits[split], written[split] = w.close(), pieces
    write_meta(root, layout=LAYOUT, splits=splits, source={"kind": "test"})
    return root, written


def test_parts_hold_what_was_written_across_part_boundaries(tmp_path):
    root, written = make_dataset(tmp_path / "d")
    ds = Dataset(root)
    assert [p["rows"] for p in ds.meta["splits"]["train"]["parts"]] == [40, 40, 10]
    assert ds.meta["id_dtype"] == "int32" and ds.meta["version"] == 2
    got = [ds.read(c) for c in ds.chunks("train", 40)]
    labels = np.concatenate([p[2] for p in written["train"]])
    assert ds.base_rate() == pytest.approx(labels.mean())
    for j in range(2):  # each multi-hot feature: every row's list, in order
        want = [list(p[4][j][0][p[4][j][1][i]:p[4][j][1][i + 1]])
                for p in written["train"] for i in range(len(p[2]))]
        have = [b.multi[j][0][b.multi[j][1][i]:b.multi[j][1][i + 1]].tolist()
                for b in got for i in range(len(b))]
        assert have == want
    weights = np.concatenate([p[3] for p in written["train"]])
    np.testing.assert_array_equal(torch.cat([b.weight for b in got]).numpy(), weights)


def test_shuffled_batches_keep_each_rows_lists_with_the_row(tmp_path):
    root, _ = make_dataset(tmp_path / "d")
    ds = Dataset(root)
    chunk = ds.chunks("train", 40)[0]
    whole = ds.read(chunk)
    by_index = {int(whole.dense[i, 0]): i for i in range(len(whole))}
    seen = []
    for b in ds.batches(chunk, 7, shuffle_seed=3):
        for i in range(len(b)):
            r = by_index[int(b.dense[i, 0])]
            seen.append(r)
            for j in range(2):
                v, o = b.multi[j]
                wv, wo = whole.multi[j]
                assert v[o[i]:o[i + 1]].tolist() == wv[wo[r]:wo[r + 1]].tolist()
            assert b.weight[i] == whole.weight[r] and torch.equal(b.sparse[i], whole.sparse[r])
    assert sorted(seen) == list(range(40)) and seen != list(range(40))


def test_a_multi_hot_id_outside_its_table_names_file_feature_and_table(tmp_path):
    root, _ = make_dataset(tmp_path / "d")
    path = part_paths(root / "train", "part-00001", LAYOUT)["multi1.values"]
    values = np.load(path)
    values[3] = 50
    np.save(path, values)
    ds = Dataset(root)
    with pytest.raises(DataFormatError) as e:
        ds.read(ds.chunks("train", 40)[1])
    msg = str(e.value)
    assert str(path) in msg and "value 3 (feature history, table item): id 50" in msg


def test_offsets_that_decrease_are_refused(tmp_path):
    root, _ = make_dataset(tmp_path / "d")
    path = part_paths(root / "eval", "part-00000", LAYOUT)["multi0.offsets"]
    offsets = np.load(path)
    offsets[5] = offsets[4] - 1 if offsets[4] else 10**6
    np.save(path, offsets)
    with pytest.raises(DataFormatError, match="never decrease|expected int64"):
        Dataset(root).parts("eval")


def test_a_feature_naming_no_table_is_refused_on_open(tmp_path):
    root, _ = make_dataset(tmp_path / "d")
    meta = json.loads((root / "meta.json").read_text())
    meta["features"][1]["table"] = "../etc"
    (root / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFormatError, match=r"features\[1\]\.table .*names no table"):
        Dataset(root)


def test_tables_beyond_int32_store_int64_ids(tmp_path):
    big = Layout(dense=(), features=(Feature("a", "a"),), tables=(Table("a", 2**33),))
    w = SplitWriter(tmp_path, "train", layout=big)
    w.write(np.zeros((2, 0), np.float32), np.array([[5], [2**32 + 1]]), np.ones(2, np.float32))
    write_meta(tmp_path, layout=big, splits={"train": w.close()}, source={})
    ds = Dataset(tmp_path)
    assert ds.meta["id_dtype"] == "int64"
    assert ds.read(ds.chunks("train", 10)[0]).sparse[:, 0].tolist() == [5, 2**32 + 1]


def test_version_1_meta_json_is_read_as_the_criteo_layout(tmp_path):
    from test_reader import make_dataset as make_v1_shaped
    root = make_v1_shaped(tmp_path / "v1")
    meta = json.loads((root / "meta.json").read_text())
    for key in ("dense", "features", "id_dtype", "weight", "preprocessing"):
        meta.pop(key)
    meta["version"] = 1
    (root / "meta.json").write_text(json.dumps(meta))
    ds = Dataset(root)
    assert [f.name for f in ds.layout.features] == [f"C{i}" for i in range(1, 27)]
    assert len(ds.read(ds.chunks("train", 10)[0])) == 10


# ------------------------------------------------------------------------- lookups

@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_multi_hot_lookup_equals_embedding_bag_forward_and_backward(pooling):
    rng = np.random.default_rng(1)
    features = [Feature("u", "u"), Feature("h", "t", pooling, 6), Feature("g", "t", pooling, 6)]
    tables = [TableSpec("u", 20, 4), TableSpec("t", 40, 4)]
    store = EmbeddingStore(tables, RowSGD(lr=0.5), seed=4, init_scale=0.2)
    lookup = LocalLookup(store, LookupPlan(features, tables))
    n = 9
    multi = tuple(tuple(map(torch.from_numpy, ragged(rng, n, 40, 6))) for _ in range(2))
    batch = Batch(torch.zeros(n, 0), torch.from_numpy(rng.integers(0, 20, (n, 1))),
                  torch.zeros(n), multi=multi)
    bag = nn.EmbeddingBag(40, 4, mode=pooling)
    with torch.no_grad():
        bag.weight.copy_(initial_rows(4, 1, torch.arange(40), 4, 0.2))
    pulled = lookup.pull(batch)
    embs = pulled.embeddings()
    assert len(embs) == 3 and embs.stacked.shape == (n, 3, 4)
    refs = [bag(v, o[:-1]) for v, o in multi]  # empty lists: zeros, as EmbeddingBag
    for got, ref in zip(embs[1:], refs):
        torch.testing.assert_close(got, ref)
    w = torch.from_numpy(rng.standard_normal((n, 4)).astype(np.float32))
    (sum((e * w * (k + 1)).sum() for k, e in enumerate(embs[1:]))).backward()
    sum((r * w * (k + 1)).sum() for k, r in enumerate(refs)).backward()
    ids = pulled.ids[1]  # table t: both features' ids, once each
    torch.testing.assert_close(pulled.row_grads()[1], bag.weight.grad[ids])
    assert not bag.weight.grad[np.setdiff1d(np.arange(40), ids.numpy())].any()
    lookup.push(pulled)
    torch.testing.assert_close(store.pull(1, torch.arange(40)),
                               bag.weight.detach() - 0.5 * bag.weight.grad)


def test_rows_touched_by_sampled_samples_cover_multi_hot_lists():
    features = [Feature("a", "a"), Feature("m", "a", "sum", 3)]
    tables = [TableSpec("a", 20, 2)]
    plan = LookupPlan(features, tables)
    multi = ((torch.tensor([7, 8, 9]), torch.tensor([0, 2, 2, 3])),)  # row 0: 7, 8; row 2: 9
    batch = Batch(torch.zeros(3, 0), torch.tensor([[1], [2], [3]]), torch.zeros(3), multi=multi)
    tables_ids = plan.dedup(batch)
    pulled = plan.fuse(batch, tables_ids, [torch.zeros(len(u), 2) for u, _ in tables_ids])
    mask = pulled.touched_by(torch.tensor([True, False, False]))[0]
    assert pulled.ids[0][mask].tolist() == [1, 7, 8]
