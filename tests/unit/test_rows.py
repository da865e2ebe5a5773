"""recsync.data.rows.preprocess_table: raw rows preprocessed exactly as `recsync data convert`
preprocessed the training data (the same ids, dense values, lists, labels and weights), the
label optional, bad rows reported as a conversion reports them."""

from __future__ import annotations

import csv
import gzip
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import torch

import recsync
from recsync.bench.quality import shared_data_dir
from recsync.data.convert_input import ConvertError
from recsync.data.reader import Batch, Dataset
from recsync.data.rows import preprocess, preprocess_files, preprocess_table
from recsync.data.schema import load_schema, parse_schema
from recsync.data.synthetic import SynthSpec, generate
from recsync.data.value_hash import hash_one

SCHEMA = """
weight = "w"
[label]
column = "rating"
threshold = 4
[[dense]]
name = "clicks"
transform = "log1p"
[[dense]]
name = "price"
transform = "standardize"
[[dense]]
name = "age"
column = "user_age"
[[categorical]]
name = "user"
[[categorical]]
name = "item"
table = "item"
[[multi_hot]]
name = "history"
table = "item"
separator = "|"
max_len = 3
pooling = "sum"
[[multi_hot]]
name = "tags"
separator = ";"
max_len = 2
[tables.item]
rows = 1000
[tables.tags]
rows = 50
[defaults]
table_rows = 500
[split]
eval_fraction = 0.25
"""
HEADER = ["rating", "w", "clicks", "price", "user_age", "user", "item", "history", "tags", "day"]
ROWS = [  # every feature kind, missing values, a long list, empty elements, bad rows
    ["5", "1.0", "3", "1.5", "30", "alice", "i1", "i2|i3|i4|i5", "a;b", "mon"],
    ["2", "0.5", "", "2.5", "", "bob", "i2", "", "", "mon"],
    ["4", "2", "-4", "", "41.5", "", "i3", "i1||i2", "c", "tue"],
    ["1", "1", "abc", "1", "1", "x", "i1", "i1", "a", "tue"],  # bad: a dense value
    ["3", "1", "7", "4", "22", "alice", "", "i5|i1", "b;;a;c", "wed"],
    ["4", "", "7", "4", "22", "alice", "i9", "i5", "b", "wed"],  # bad: no weight
    ["0", "1", "0", "-3", "1e2", "007", "7", "7|7.0", "a", "thu"],
    ["5", "3", "12", "0.25", "-2", "carol", "i4", "i4|i3", "", "fri"],
]
BAD = [3, 5]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The CSV above converted (skipping its bad rows), and the CSV's path."""
    root = tmp_path_factory.mktemp("rows")
    (root / "schema.toml").write_text(SCHEMA)
    with open(root / "in.csv", "w", newline="") as f:
        csv.writer(f).writerows([HEADER, *ROWS])
    recsync.convert(root / "in.csv", root / "data", schema=root / "schema.toml", progress=False)
    return Dataset(root / "data"), root / "in.csv"


def read_text(path, schema) -> pa.Table:
    """A CSV/TSV file's columns as text, as a user might load raw rows to score (lines of the
    wrong field count left out, as the conversion leaves them out)."""
    opts = schema.input
    names = list(opts.columns) if not opts.header else None
    if names is None:
        with open(path, newline="", encoding="utf-8-sig") as f:
            names = next(csv.reader(f, delimiter=opts.delimiter))
    return pcsv.read_csv(
        path, read_options=pcsv.ReadOptions(column_names=names, skip_rows=int(opts.header)),
        parse_options=pcsv.ParseOptions(delimiter=opts.delimiter,
                                        invalid_row_handler=lambda row: "skip"),
        convert_options=pcsv.ConvertOptions(column_types={c: pa.string() for c in names}))


def load_schema_text():
    return parse_schema(SCHEMA, "test")


def whole(ds: Dataset) -> Batch:
    """Every row the conversion wrote, train then eval: input order for these schemas."""
    batches = [ds.read(c) for s in ("train", "eval") for c in ds.chunks(s, 1 << 30)]
    multi = []
    for j in range(len(ds.layout.multi)):
        values = np.concatenate([b.multi[j][0].numpy() for b in batches])
        lengths = np.concatenate([np.diff(b.multi[j][1].numpy()) for b in batches])
        multi.append((values, np.concatenate([[0], np.cumsum(lengths)])))
    cat = lambda get: np.concatenate([get(b) for b in batches])  # noqa: E731
    return Batch(dense=cat(lambda b: b.dense.numpy()), sparse=cat(lambda b: b.sparse.numpy()),
                 label=cat(lambda b: b.label.numpy()),
                 weight=None if batches[0].weight is None else cat(lambda b: b.weight.numpy()),
                 multi=tuple(multi))


def assert_same(got: Batch, want: Batch, label: bool = True) -> None:
    assert got.dense.numpy().dtype == want.dense.dtype == np.float32
    assert got.sparse.numpy().dtype == want.sparse.dtype == np.int64
    np.testing.assert_array_equal(got.dense.numpy(), want.dense)  # bit for bit
    np.testing.assert_array_equal(got.sparse.numpy(), want.sparse)
    if label:
        np.testing.assert_array_equal(got.label.numpy(), want.label)
    if want.weight is not None and got.weight is not None:
        np.testing.assert_array_equal(got.weight.numpy(), want.weight)
    assert len(got.multi) == len(want.multi)
    for (gv, go), (wv, wo) in zip(got.multi, want.multi):
        np.testing.assert_array_equal(gv.numpy(), wv)
        np.testing.assert_array_equal(go.numpy(), wo)


def test_rows_get_exactly_what_the_conversion_wrote(converted):
    ds, path = converted
    table = read_text(path, load_schema_text())
    batch, report = preprocess(table, ds.meta, source="in.csv", strict=False)
    assert_same(batch, whole(ds))
    assert report.rows == len(ROWS) and report.bad == len(BAD)
    assert report.kept.tolist() == [i for i in range(len(ROWS)) if i not in BAD]
    assert report.truncated == 2  # i2|i3|i4|i5 and b;;a;c (empty elements do not count)
    assert [(e.where, e.column) for e in report.examples] == [("in.csv: row 3", "clicks"),
                                                              ("in.csv: row 5", "w")]
    assert report.examples[0].reason == "'abc' is not a number"


def test_the_preprocessing_by_hand(converted):
    ds, _ = converted
    rows = {"clicks": ["3", None], "price": ["1.5", None], "user_age": ["30", ""],
            "user": ["alice", None], "item": ["i1", ""], "history": ["i2|i3|i4|i5", "||"],
            "tags": ["a;b", None]}
    b = preprocess_table(rows, ds.meta)
    train_prices = [1.5, 2.5, 4.0]  # the train rows' (the bad row's 1 is not one of them)
    mean, std = np.mean(train_prices), np.std(train_prices)
    item = lambda v: 1 + hash_one(v) % 999  # noqa: E731
    np.testing.assert_allclose(b.dense.numpy(), [[math.log(4), (1.5 - mean) / std, 30],
                                                 [0, 0, 0]], rtol=1e-6)  # missing: 0
    assert b.sparse.tolist() == [[1 + hash_one("alice") % 499, item("i1")], [0, 0]]
    values, offsets = b.multi[0]
    assert values.tolist() == [item("i2"), item("i3"), item("i4")]  # max_len 3; item's table
    assert offsets.tolist() == [0, 3, 3]
    assert b.multi[1][0].tolist() == [1 + hash_one("a") % 49, 1 + hash_one("b") % 49]
    assert b.label.isnan().all() and b.weight is None  # no label or weight column: none


def test_without_a_label_or_weight_the_features_are_the_same(converted):
    ds, path = converted
    table = read_text(path, load_schema_text())
    features = table.drop_columns(["rating", "w"])
    batch, report = preprocess(features, ds.meta, strict=False)
    assert report.bad == 1 and report.kept.tolist() == [0, 1, 2, 4, 5, 6, 7]  # row 5 is fine now
    assert np.isnan(batch.label.numpy()).all() and batch.weight is None
    want, _ = preprocess(table.drop_columns(["w"]).drop_columns(["rating"]), ds.meta,
                         strict=False)
    assert_same(batch, whole_of(want), label=False)


def whole_of(b: Batch) -> Batch:
    return Batch(b.dense.numpy(), b.sparse.numpy(), b.label.numpy(),
                 None if b.weight is None else b.weight.numpy(),
                 tuple((v.numpy(), o.numpy()) for v, o in b.multi))


def test_native_columns_hash_as_their_text(converted):
    """Numbers as numbers and lists as lists give what their CSV text gives, as Parquet."""
    ds, path = converted
    text = read_text(path, load_schema_text()).take([6, 7])
    native = {"rating": [0, 5], "w": [1.0, 3.0], "clicks": [0, 12], "price": [-3.0, 0.25],
              "user_age": [100.0, -2.0], "user": ["007", "carol"], "item": [7, None],
              "history": [["7", "7.0"], ["i4", "i3"]], "tags": [["a"], []]}
    native["item"] = [7, 0]
    got = preprocess_table(pa.table(native).set_column(6, "item", pa.array(["7", "i4"])),
                           ds.meta)
    assert_same(got, whole_of(preprocess_table(text, ds.meta)))
    ints = preprocess_table({**native, "item": pa.array([7, 7])}, ds.meta)
    assert ints.sparse[0, 1] == got.sparse[0, 1]  # 7 hashes as "7"


def test_parquet_rows_and_arrow_tables_agree(converted, tmp_path):
    ds, path = converted
    table = read_text(path, load_schema_text())
    pq.write_table(table, tmp_path / "rows.parquet")
    a = preprocess(pq.read_table(tmp_path / "rows.parquet"), ds.meta, strict=False)[0]
    assert_same(a, whole(ds))


def concat(pieces) -> Batch:
    """Pieces of preprocess_files as one batch, and their reports."""
    pieces = list(pieces)
    multi = []
    for j in range(len(pieces[0][0].multi)):
        lengths = np.concatenate([np.diff(b.multi[j][1].numpy()) for b, _ in pieces])
        multi.append((np.concatenate([b.multi[j][0].numpy() for b, _ in pieces]),
                      np.concatenate([[0], np.cumsum(lengths)])))
    cat = lambda get: torch.from_numpy(np.concatenate([get(b) for b, _ in pieces]))  # noqa
    return Batch(cat(lambda b: b.dense.numpy()), cat(lambda b: b.sparse.numpy()),
                 cat(lambda b: b.label.numpy()),
                 None if pieces[0][0].weight is None else cat(lambda b: b.weight.numpy()),
                 tuple((torch.from_numpy(v), torch.from_numpy(o)) for v, o in multi)), \
        [r for _, r in pieces]


def test_files_are_read_as_the_conversion_reads_them(converted, tmp_path):
    ds, path = converted
    gz = tmp_path / "in.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    for p in (path, gz):
        batch, reports = concat(preprocess_files([p], ds.meta, strict=False))
        assert_same(batch, whole(ds))
        assert np.concatenate([r.kept for r in reports]).tolist() == [0, 1, 2, 4, 6, 7]
        assert [e.where for r in reports for e in r.examples] == [f"{p}:5", f"{p}:7"]
    with pytest.raises(ConvertError, match=rf"^{path}:5: column clicks: 'abc' is not a number "
                                           rf"\(strict\)$"):
        list(preprocess_files(path, ds.meta))


def test_a_bad_row_stops_with_its_source_and_row(converted):
    ds, path = converted
    table = read_text(path, load_schema_text())
    with pytest.raises(ConvertError, match=r"^day_0\.csv: row 1003: column clicks: 'abc' is "
                                           r"not a number \(strict\)$"):
        preprocess_table(table, ds.meta, source="day_0.csv", first_row=1000)
    with pytest.warns(UserWarning, match=r"2 of 8 rows of in\.csv are bad and were skipped; "
                                         r"first: in\.csv: row 3: column clicks"):
        assert len(preprocess_table(table, ds.meta, source="in.csv", strict=False)) == 6


def test_a_missing_feature_column_is_named_with_its_schema_key(converted):
    ds, path = converted
    table = read_text(path, load_schema_text()).drop_columns(["user_age"])
    with pytest.raises(ConvertError, match=r"^x: column 'user_age' \(dense\[2\]\.column in the "
                                           r"schema\) is not in its columns"):
        preprocess_table(table, ds.meta, source="x")
    with pytest.raises(TypeError, match="pyarrow Table, a pandas DataFrame or a dict"):
        preprocess_table([[1, 2]], ds.meta)


def test_pandas_rows(converted):
    pd = pytest.importorskip("pandas")
    ds, path = converted
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    got = preprocess(df, ds.meta, strict=False)[0]
    assert_same(got, whole(ds))


def test_synthetic_data_has_no_raw_rows(tmp_path):
    generate(tmp_path, rows=64, eval_rows=16, spec=SynthSpec(seed=1, max_table_rows=50),
             processes=1, progress=False)
    with pytest.raises(ValueError, match=r"^raw rows cannot be scored for synthetic data .*"
                                         r"score rows of a data directory instead"):
        preprocess_table({"I1": [1]}, Dataset(tmp_path).meta)


# -- the shared real samples (skipped where ../shared/data is absent) -------------------------

SHARED = shared_data_dir()
SAMPLES = {  # sample folder -> (input files, preset)
    "criteo_sample_deepctr": (["criteo_sample.txt"], "criteo_csv"),
    "criteo_raw_paddlerec": (["sample_train.txt"], "criteo"),
    "avazu_sample_deepctr": (["avazu_sample.txt"], "avazu"),
    "movielens_sample_deepctr": (["movielens_sample.txt"], "movielens"),
    "taobao_tiny_fuxictr": (["train_sample.csv", "valid_sample.csv"], "taobao"),
}
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared samples at {SHARED}")


@needs_shared
@pytest.mark.parametrize("name", SAMPLES)
def test_shared_samples_preprocess_as_they_converted(name, tmp_path):
    files, preset = SAMPLES[name]
    paths = [SHARED / name / f for f in files]
    recsync.convert(paths, tmp_path / "data", preset=preset, progress=False)
    ds = Dataset(tmp_path / "data")
    schema = load_schema(preset=preset)
    table = pa.concat_tables([read_text(p, schema) for p in paths])
    got, report = preprocess(table, ds.meta, source=name, strict=False)
    assert len(got) == ds.rows("train") + ds.rows("eval") > 0
    assert_same(got, whole(ds))


@needs_shared
def test_raw_criteo_rows_of_a_criteo_data_set(tmp_path):
    """`recsync data criteo` (preset criteo): raw rows, labelled or not, give its rows."""
    from criteo_oracle import COLUMNS
    from test_criteo import convert as convert_criteo
    path = SHARED / "criteo_raw_paddlerec" / "sample_train.txt"
    convert_criteo(path, tmp_path / "data", table_size=1000)
    ds = Dataset(tmp_path / "data")
    table = pcsv.read_csv(path, read_options=pcsv.ReadOptions(column_names=COLUMNS),
                          parse_options=pcsv.ParseOptions(delimiter="\t"),
                          convert_options=pcsv.ConvertOptions(
                              column_types={c: pa.string() for c in COLUMNS}))
    got, report = preprocess(table, ds.meta, source="sample_train.txt")
    assert report.bad == 0 and len(got) == table.num_rows
    assert_same(got, whole(ds))
    unlabelled = preprocess_table(table.drop_columns(["label"]), ds.meta)
    assert np.isnan(unlabelled.label.numpy()).all()
    assert_same(unlabelled, whole(ds), label=False)
    bad = table.set_column(1, "I1", pa.array(["x"] + [None] * (table.num_rows - 1)))
    with pytest.raises(ConvertError, match=r"^t: row 0: column I1: 'x' is not a number"):
        preprocess_table(bad, ds.meta, source="t")


@needs_shared
def test_a_kaggle_test_file_without_labels_is_scored_with_the_criteo_preset(tmp_path):
    """39 fields, no label: the preset's columns without "label"."""
    train = SHARED / "criteo_kaggle_train_head1k" / "train_head1k.txt"
    test = SHARED / "criteo_kaggle_test_head10k" / "test_head10k.txt"
    recsync.convert(train, tmp_path / "data", preset="criteo", progress=False)
    meta = Dataset(tmp_path / "data").meta
    columns = [c for c in load_schema(preset="criteo").input.columns if c != "label"]
    batch, reports = concat(preprocess_files(test, meta, columns=columns))
    assert len(batch.label) == 10_000 and batch.label.isnan().all()
    assert sum(r.bad for r in reports) == 0
    schema = load_schema(preset="criteo")
    table = read_text(test, schema.model_copy(update={"input": schema.input.model_copy(
        update={"columns": columns})}))
    assert_same(preprocess_table(table, meta), whole_of(batch), label=False)



@pytest.mark.parametrize("quoted", [False, True])  # the fast path, and pyarrow's CSV reader
def test_ids_of_tables_beyond_int32_do_not_wrap(tmp_path, quoted):
    (tmp_path / "s.toml").write_text('[label]\ncolumn = "y"\n[[categorical]]\nname = "u"\n'
                                     '[tables.u]\nrows = 1099511627776\n[split]\n'
                                     'eval_fraction = 0.0\n')
    values = ["alice", "bob", "carol", '"d,e"' if quoted else "dave"]
    (tmp_path / "in.csv").write_text("y,u\n" + "".join(f"1,{v}\n" for v in values))
    recsync.convert(tmp_path / "in.csv", tmp_path / "data", schema=tmp_path / "s.toml",
                    progress=False)
    ds = Dataset(tmp_path / "data")
    want = [1 + hash_one(v.strip('"')) % (2**40 - 1) for v in values]
    assert max(want) > 2**31
    assert whole(ds).sparse[:, 0].tolist() == want
    got = preprocess_table({"u": [v.strip('"') for v in values]}, ds.meta)
    assert got.sparse[:, 0].tolist() == want
