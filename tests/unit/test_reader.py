"""Dataset reader: chunks, batches (in order and shuffled), chunk order, dtypes, format errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from recsync.data.format import (NUM_DENSE, NUM_TABLES, DataFormatError, SplitWriter,
                                 part_paths, write_meta)
from recsync.data.reader import Chunk, Dataset, chunk_order

TRAIN_ROWS, EVAL_ROWS, PART_ROWS = 250, 70, 100
TABLE_ROWS = [1000 + t for t in range(NUM_TABLES)]


def rows_of(n: int, offset: int):
    """Rows whose content encodes their global index: dense[:, 0] = index, ids derived from it."""
    idx = np.arange(offset, offset + n)
    dense = np.zeros((n, NUM_DENSE), np.float32)
    dense[:, 0] = idx
    dense[:, 1:] = np.linspace(0, 1, NUM_DENSE - 1, dtype=np.float32)
    sparse = (idx[:, None] * 7 + np.arange(NUM_TABLES)[None, :]) % np.array(TABLE_ROWS)
    label = (idx % 3 == 0).astype(np.float32)
    return dense, sparse.astype(np.int32), label


def make_dataset(root, train_rows=TRAIN_ROWS, eval_rows=EVAL_ROWS, part_rows=PART_ROWS):
    splits = {}
    for split, n, offset in (("train", train_rows, 0), ("eval", eval_rows, 10_000)):
        w = SplitWriter(root, split, part_rows=part_rows)
        # written in uneven pieces: parts are cut by row count, not by write call
        for start in range(0, n, 37):
            w.write(*rows_of(min(37, n - start), offset + start))
        splits[split] = w.close()
    write_meta(root, table_rows=TABLE_ROWS, splits=splits, source={"kind": "test"})
    return root


@pytest.fixture
def ds(tmp_path):
    return Dataset(make_dataset(tmp_path / "data"))


def index_of(batch) -> list[int]:
    return batch.dense[:, 0].to(torch.int64).tolist()


# ------------------------------------------------------------------------------------ meta

def test_open(ds):
    assert ds.rows("train") == TRAIN_ROWS and ds.rows("eval") == EVAL_ROWS
    assert ds.table_rows == TABLE_ROWS
    assert ds.table_names == [f"C{i}" for i in range(1, 27)]
    assert ds.synthetic is None
    assert [p["rows"] for p in ds.meta["splits"]["train"]["parts"]] == [100, 100, 50]
    with pytest.raises(DataFormatError, match="no split 'test'"):
        ds.rows("test")


# ------------------------------------------------------------------------------------ chunks

@pytest.mark.parametrize("chunk_rows", [1, 7, 30, 100, 101, 1000])
def test_chunks_cover_every_row_once_and_never_cross_parts(ds, chunk_rows):
    chunks = ds.chunks("train", chunk_rows)
    part_rows = [p["rows"] for p in ds.meta["splits"]["train"]["parts"]]
    seen = []
    for c in chunks:
        assert c.split == "train"
        assert 0 <= c.start < c.stop <= part_rows[c.part]   # within one part
        assert c.rows == c.stop - c.start <= chunk_rows
        seen += index_of(ds.read(c))
    assert sorted(seen) == list(range(TRAIN_ROWS))
    assert seen == list(range(TRAIN_ROWS))  # chunks come in storage order
    # the fewest chunks that respect both limits
    assert len(chunks) == sum(-(-n // chunk_rows) for n in part_rows)


def test_bad_chunk_rows(ds):
    with pytest.raises(ValueError, match="chunk_rows"):
        ds.chunks("train", 0)


def test_dtypes_and_shapes(ds):
    batch = next(ds.batches(ds.chunks("train", 64)[0], 16))
    assert batch.dense.dtype == torch.float32 and batch.dense.shape == (16, NUM_DENSE)
    assert batch.sparse.dtype == torch.int64 and batch.sparse.shape == (16, NUM_TABLES)
    assert batch.label.dtype == torch.float32 and batch.label.shape == (16,)
    assert len(batch) == 16
    shuffled = next(ds.batches(ds.chunks("train", 64)[0], 16, shuffle_seed=1))
    assert (shuffled.dense.dtype, shuffled.sparse.dtype, shuffled.label.dtype) == (
        torch.float32, torch.int64, torch.float32)


def test_read_returns_the_stored_rows(ds):
    chunk = ds.chunks("train", 30)[5]          # part 1, rows 30..60 of it: global 130..160
    assert (chunk.part, chunk.start, chunk.stop) == (1, 30, 60)
    batch = ds.read(chunk)
    dense, sparse, label = rows_of(30, 130)
    np.testing.assert_array_equal(batch.dense.numpy(), dense)
    np.testing.assert_array_equal(batch.sparse.numpy(), sparse.astype(np.int64))
    np.testing.assert_array_equal(batch.label.numpy(), label)
    # rows relative to the chunk start, as a slice or as indices
    assert index_of(ds.read(chunk, slice(3, 6))) == [133, 134, 135]
    assert index_of(ds.read(chunk, np.array([4, 0, 29]))) == [134, 130, 159]


def test_read_returns_writable_copies(ds):
    chunk = ds.chunks("train", 30)[0]
    batch = ds.read(chunk)
    batch.dense += 1  # must not write through to the memory map (it is read-only)
    assert index_of(ds.read(chunk)) == list(range(30))


# ------------------------------------------------------------------------------------ batches

def test_batches_in_order_reproduce_the_split(ds):
    out, sizes = [], []
    for chunk in ds.chunks("train", 48):
        for batch in ds.batches(chunk, 10):
            out += index_of(batch)
            sizes.append(len(batch))
    assert out == list(range(TRAIN_ROWS))
    assert max(sizes) == 10 and min(sizes) >= 1  # the last batch of a chunk may be short


def test_eval_split(ds):
    out = [i for c in ds.chunks("eval", 1000) for b in ds.batches(c, 32) for i in index_of(b)]
    assert out == list(range(10_000, 10_000 + EVAL_ROWS))


def test_shuffled_batches_permute_the_chunk(ds):
    chunk = ds.chunks("train", 100)[1]
    batches = list(ds.batches(chunk, 16, shuffle_seed=5, epoch=0))
    assert [len(b) for b in batches] == [16] * 6 + [4]
    got = [i for b in batches for i in index_of(b)]
    assert sorted(got) == list(range(100, 200))
    assert got != list(range(100, 200))
    # every row keeps its own ids and label
    for b in batches:
        for j, i in enumerate(index_of(b)):
            _, sparse, label = rows_of(1, i)
            assert b.sparse[j].tolist() == sparse[0].tolist()
            assert b.label[j].item() == label[0]


def test_shuffle_is_deterministic_per_seed_and_epoch(ds):
    chunk = ds.chunks("train", 100)[0]

    def order(seed, epoch):
        return [i for b in ds.batches(chunk, 32, shuffle_seed=seed, epoch=epoch)
                for i in index_of(b)]

    assert order(5, 0) == order(5, 0)
    assert order(5, 3) == order(5, 3)
    assert order(5, 0) != order(5, 1)
    assert order(5, 0) != order(6, 0)
    # a fresh Dataset (another process) shuffles the same way
    assert order(5, 2) == [i for b in Dataset(ds.root).batches(chunk, 32, shuffle_seed=5,
                                                                 epoch=2) for i in index_of(b)]


def test_chunks_of_one_epoch_shuffle_differently(ds):
    a, b = ds.chunks("train", 50)[:2]
    first = lambda c: [i - c.start - 100 * c.part  # noqa: E731  position within the chunk
                       for x in ds.batches(c, 50, shuffle_seed=1) for i in index_of(x)]
    assert first(a) != first(b)


# ------------------------------------------------------------------------------------ chunk order

def test_chunk_order():
    chunks = [Chunk("train", p, s, s + 10) for p in range(3) for s in (0, 10, 20, 30)]
    assert chunk_order(chunks, epoch=0, shuffle_seed=None) == chunks
    assert chunk_order(chunks, epoch=4, shuffle_seed=None) == chunks
    e0 = chunk_order(chunks, epoch=0, shuffle_seed=7)
    assert sorted(e0, key=lambda c: (c.part, c.start)) == chunks
    assert e0 != chunks
    assert e0 == chunk_order(chunks, epoch=0, shuffle_seed=7)
    assert e0 != chunk_order(chunks, epoch=1, shuffle_seed=7)
    assert e0 != chunk_order(chunks, epoch=0, shuffle_seed=8)
    original = list(chunks)
    chunk_order(chunks, epoch=0, shuffle_seed=None).reverse()
    assert chunks == original  # a new list, never the caller's


# ------------------------------------------------------------------------------------ errors

def test_missing_directory(tmp_path):
    with pytest.raises(DataFormatError, match=re.escape(str(tmp_path / "nowhere"))):
        Dataset(tmp_path / "nowhere")


def test_missing_meta_json(tmp_path):
    root = make_dataset(tmp_path / "data")
    (root / "meta.json").unlink()
    with pytest.raises(DataFormatError) as e:
        Dataset(root)
    assert str(root / "meta.json") in str(e.value)
    assert "missing" in str(e.value)


def edit_meta(root, **changes):
    meta = json.loads((root / "meta.json").read_text())
    meta.update(changes)
    (root / "meta.json").write_text(json.dumps(meta))
    return meta


def test_wrong_format_version(tmp_path):
    root = make_dataset(tmp_path / "data")
    edit_meta(root, version=99)
    with pytest.raises(DataFormatError, match="version 99") as e:
        Dataset(root)
    assert str(root / "meta.json") in str(e.value)


def test_wrong_format_name(tmp_path):
    root = make_dataset(tmp_path / "data")
    edit_meta(root, format="something-else")
    with pytest.raises(DataFormatError, match=re.escape(str(root / "meta.json"))):
        Dataset(root)


def test_meta_json_not_json(tmp_path):
    root = make_dataset(tmp_path / "data")
    (root / "meta.json").write_text("{not json")
    with pytest.raises(DataFormatError, match=re.escape(str(root / "meta.json"))):
        Dataset(root)


def test_part_with_wrong_row_count(tmp_path):
    root = make_dataset(tmp_path / "data")
    bad = part_paths(root / "train", "part-00001")["label"]
    np.save(bad, np.zeros(99, np.float32))
    ds = Dataset(root)  # opening is cheap: parts are checked when first read
    with pytest.raises(DataFormatError) as e:
        ds.read(ds.chunks("train", 10)[0])
    assert str(bad) in str(e.value)
    assert "99 rows" in str(e.value) and "says 100" in str(e.value)


def test_meta_row_count_disagrees_with_part(tmp_path):
    root = make_dataset(tmp_path / "data")
    meta = json.loads((root / "meta.json").read_text())
    meta["splits"]["eval"]["parts"][0]["rows"] = 71
    meta["splits"]["eval"]["rows"] = 71  # consistent within meta.json, not with the file
    (root / "meta.json").write_text(json.dumps(meta))
    ds = Dataset(root)
    dense = part_paths(root / "eval", "part-00000")["dense"]
    with pytest.raises(DataFormatError, match=re.escape(str(dense))):
        ds.parts("eval")


def test_missing_part_file(tmp_path):
    root = make_dataset(tmp_path / "data")
    gone = part_paths(root / "train", "part-00002")["sparse"]
    gone.unlink()
    with pytest.raises(DataFormatError, match=re.escape(str(gone))):
        Dataset(root).parts("train")


def test_sparse_with_wrong_table_count(tmp_path):
    root = make_dataset(tmp_path / "data")
    path = part_paths(root / "train", "part-00000")["sparse"]
    np.save(path, np.zeros((100, NUM_TABLES - 1), np.int32))
    with pytest.raises(DataFormatError, match=re.escape(str(path))):
        Dataset(root).parts("train")


@pytest.mark.parametrize("seed", [None, 5])
def test_batches_from_a_row_with_a_batch_size_that_changes_read_the_rest_once(ds, seed):
    """A worker of an elastic sync run goes on from the rows trained before (a hand over), at
    the share of the global batch its group gives it, which may change between batches."""
    chunk = ds.chunks("train", 100)[1]
    whole = [i for b in ds.batches(chunk, 16, shuffle_seed=seed, epoch=1) for i in index_of(b)]
    sizes = iter([7, 7, 30, 3])
    got = list(ds.batches(chunk, lambda: next(sizes, 11), shuffle_seed=seed, epoch=1,
                          start=23))
    assert [len(b) for b in got] == [7, 7, 30, 3, 11, 11, 8]
    assert [i for b in got for i in index_of(b)] == whole[23:]
    assert list(ds.batches(chunk, 16, shuffle_seed=seed, start=100)) == []
