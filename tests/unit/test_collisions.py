"""Collisions of hashed ids (recsync/data/collisions.py): distinct values against the distinct ids
fixed and dynamic tables give them, checked on hand-made files and held to the ids a conversion
writes; and every real sample in ../shared/data (skipped where absent; RECSYNC_SHARED_DATA
points elsewhere) with its preset: 0 collisions with dynamic tables, the fixed count printed.

    PYTHONPATH=. python -m pytest -q -p no:xdist -s tests/unit/test_collisions.py
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsync.data.collisions import count_collisions
from recsync.data.convert import convert
from recsync.data.convert_input import ConvertError
from recsync.data.reader import Dataset
from recsync.data.schema import load_preset, parse_schema
from recsync.data.value_hash import hash_one
from recsync.bench.dynamic_data import SAMPLES  # the shared samples and their presets

SHARED = Path(os.environ.get("RECSYNC_SHARED_DATA")
              or Path(__file__).resolve().parents[3] / "shared" / "data")

SCHEMA = """
[label]
column = "y"
[[dense]]
name = "x"
[[categorical]]
name = "c"
[[categorical]]
name = "d"
table = "shared"
[[multi_hot]]
name = "m"
table = "shared"
separator = "|"
max_len = 2
[tables.c]
rows = 2
[tables.shared]
rows = 1000
"""


def distinct_ids(root: Path) -> dict[str, int]:
    """Per table, the distinct ids (0 left out) of a converted data set, through the reader."""
    ds = Dataset(root)
    seen: dict[str, set] = {t: set() for t in ds.table_names}
    for split in ("train", "eval"):
        for chunk in ds.chunks(split, 100_000):
            b = ds.read(chunk)
            for j, f in enumerate(ds.layout.single):
                seen[f.table] |= set(b.sparse[:, j].tolist())
            for j, f in enumerate(ds.layout.multi):
                seen[f.table] |= set(b.multi[j][0].tolist())
    return {t: len(ids - {0}) for t, ids in seen.items()}


def test_counts_values_and_ids_per_table(tmp_path):
    # c: a 2-row table, so its 4 values share id 1; d and m share a table: "p" and "q" are one
    # value each wherever they appear; "r" is past m's max_len and row 4 is bad (x), so neither
    # counts; empty values and elements are missing.
    (tmp_path / "in.csv").write_text("y,x,c,d,m\n1,1,a,p,q|p|r\n0,2,b,,\n1,3,c,q,||s\n"
                                     "0,abc,zzz,bad,bad\n1,,d,p,q\n")
    got = {t.table: t for t in count_collisions(tmp_path / "in.csv", parse_schema(SCHEMA, "t"))}
    c, shared = got["c"], got["shared"]
    assert (c.rows, c.values, c.fixed_ids, c.dynamic_ids) == (2, 4, 1, 4)
    assert (c.fixed_collisions, c.dynamic_collisions) == (3, 0)
    assert (shared.values, shared.dynamic_ids, shared.dynamic_collisions) == (3, 3, 0)
    assert shared.fixed_ids == 3  # p, q, s in 999 rows: known not to collide


def test_the_ids_counted_are_those_a_conversion_writes(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    lines = [f"{i % 2},{i},{rng.integers(50)},{rng.integers(3000)},"
             + "|".join(str(v) for v in rng.integers(3000, size=rng.integers(4)))
             for i in range(2000)]
    (tmp_path / "in.csv").write_text("y,x,c,d,m\n" + "\n".join(lines) + "\n")
    schema = parse_schema(SCHEMA.replace("rows = 2\n", "rows = 40\n"), "t")
    got = {t.table: t for t in count_collisions(tmp_path / "in.csv", schema)}
    monkeypatch.setattr("recsync.data.collisions._MERGE_EVERY", 2)  # many small pieces, merged
    assert count_collisions(tmp_path / "in.csv", schema, block_bytes=1024) == list(got.values())
    for kind in ("fixed", "dynamic"):
        convert([tmp_path / "in.csv"], schema.with_table_kind(kind), tmp_path / kind,
                progress=False)
        assert distinct_ids(tmp_path / kind) == {t: getattr(got[t], f"{kind}_ids") for t in got}
    assert got["c"].values == 50  # values 0..49 in 39 rows: ids by the reference hash
    assert got["c"].fixed_ids == len({1 + hash_one(str(v)) % 39 for v in range(50)}) < 39
    assert got["shared"].dynamic_collisions == 0 and got["shared"].fixed_collisions > 0


def test_hex32_values_are_their_integers_and_parquet_reads_too(tmp_path):
    schema = load_preset("criteo").with_table_kind("dynamic")
    line = "\t".join(["1"] + [""] * 13 + ["68fd1e64", "notahex"] + [""] * 24)
    upper = line.replace("68fd1e64", "68FD1E64")
    (tmp_path / "day.txt").write_text(f"{line}\n{upper}\n")
    got = {t.table: t for t in count_collisions(tmp_path / "day.txt", schema)}
    assert (got["C1"].values, got["C1"].dynamic_ids, got["C2"].values) == (1, 1, 1)
    assert got["C3"].values == 0 and got["C3"].fixed_ids == 0
    table = pa.table({"y": [1, 0], "x": [1.0, 2.0], "c": [7, 8], "d": ["p", "q"],
                      "m": [["p", "q", "r"], []]})
    pq.write_table(table, tmp_path / "in.parquet")
    got = {t.table: t for t in count_collisions(tmp_path / "in.parquet",
                                                parse_schema(SCHEMA, "t"))}
    assert (got["c"].values, got["c"].fixed_ids, got["shared"].values) == (2, 1, 2)


def test_a_missing_column_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "in.csv").write_text("y,x,c,m\n1,1,a,b\n")
    with pytest.raises(ConvertError, match=r"in.csv: column 'd' \(categorical\[1\].name in "
                                           r"the schema\) is not in its header"):
        count_collisions(tmp_path / "in.csv", parse_schema(SCHEMA, "t"))


# ------------------------------------------------------------------------ the real samples



@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared sample data at {SHARED}")
@pytest.mark.parametrize("preset, files", SAMPLES)
def test_dynamic_tables_give_every_value_of_every_sample_its_own_id(tmp_path, preset, files):
    paths = [SHARED / f for f in files.split()]
    got = count_collisions(paths, load_preset(preset))
    assert sum(t.values for t in got) > 0
    for t in got:
        assert t.dynamic_collisions == 0, t
        assert t.fixed_collisions >= 0, t
    if "test_head" not in files:  # a file without labels is counted, not converted
        convert(paths, load_preset(preset).with_table_kind("dynamic"), tmp_path / "dyn",
                strict=True, progress=False)
        assert distinct_ids(tmp_path / "dyn") == {t.table: t.values for t in got}
    fixed = [f"{t.table} {t.fixed_collisions} of {t.values:,} in {t.rows:,} rows"
             for t in got if t.fixed_collisions]
    print(f"\n{files}: {sum(t.values for t in got):,} values in {len(got)} tables; dynamic 0 "
          f"collisions, fixed {sum(t.fixed_collisions for t in got)}: {'; '.join(fixed)}")
