"""Data sets of scenario `dynamic`: one synthetic data set's ids rewritten as fixed tables, as
dynamic tables, and as a drifting stream; the ids they hold; collisions on the shared samples.

The synthetic generator draws ids in ``[0, rows)`` of fixed tables (recsync/data/synthetic.py).
Its teacher's ids are rewritten here as a conversion would hash them, part file by part file,
with the dense features and labels untouched (hard links where the file system allows), so every
derived data set has the same rows, labels and teacher (its Bayes-optimal AUC stays valid: the
rewrite is a bijection of each table's ids, or for fixed tables the hashing a conversion does):

- ``derive(src, dst, rows=R)``: fixed tables of ``R`` rows, ``id = 1 + splitmix64(id) % (R - 1)``
  (id 0 stays "missing"), int32 ids as a conversion writes them;
- ``derive(src, dst, rows=R, dynamic=True)``: dynamic tables, ``id = splitmix64(id)`` read as an
  int64 (0 becomes 1), meta.json's tables ``"kind": "dynamic"`` with ``rows`` R (what they are
  sized for) and ``id_dtype`` int64;
- ``segments=K`` (dynamic): the train split cut into K consecutive segments by row; segment k
  adds ``k * SEGMENT_STRIDE`` to the teacher's id before hashing, so each segment's ids are new
  ones and the earlier ones stop appearing; the eval split takes the last segment's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from recsync.data.format import part_paths
from recsync.data.hashing import splitmix64

SEGMENT_STRIDE = 2**32  # added per segment; the teacher's ids are int32, so segments never meet
SHARED_DATA = Path(os.environ.get("RECSYNC_SHARED_DATA")
                   or Path(__file__).resolve().parents[3] / "shared" / "data")
# the shared samples and their presets (as tests/unit/test_collisions.py counts them)
SAMPLES = [("criteo", "criteo_kaggle_train_head1k/train_head1k.txt"),
           ("criteo", "criteo_kaggle_test_head10k/test_head10k.txt"),
           ("criteo", "criteo_raw_paddlerec/sample_train.txt"),
           ("criteo_csv", "criteo_sample_deepctr/criteo_sample.txt"),
           ("avazu", "avazu_head9k/avazu_train_head9k.csv"),
           ("avazu", "avazu_sample_deepctr/avazu_sample.txt"),
           ("movielens", "movielens_sample_deepctr/movielens_sample.txt"),
           ("taobao", "taobao_tiny_fuxictr/train_sample.csv taobao_tiny_fuxictr/valid_sample.csv")]


def hashed_ids(ids: np.ndarray, *, rows: int, dynamic: bool,
               offset: np.ndarray | int = 0) -> np.ndarray:
    """The ids a conversion gives the teacher's ``ids`` ([rows, tables] ints; ``offset``: one
    for all or one per row, added before hashing): dynamic int64 (0 -> 1), fixed int32 in
    [1, rows)."""
    off = np.asarray(offset).astype(np.uint64)
    h = splitmix64(ids.astype(np.uint64) + (off[:, None] if off.ndim else off))
    if dynamic:
        out = h.view(np.int64)
        out[out == 0] = 1
        return out
    if rows < 2:
        raise ValueError(f"a fixed table needs rows >= 2 (id 0 is missing), got {rows}")
    return (h % np.uint64(rows - 1) + np.uint64(1)).astype(np.int32)


def derive(src: Path, dst: Path, *, rows: int, dynamic: bool = False, segments: int = 1) -> Path:
    """Write ``dst``: the data set ``src`` (single-hot tables only, as synthetic data) with its
    ids rewritten (module docstring); meta.json last. Replaces ``dst``."""
    if segments < 1 or (segments > 1 and not dynamic):
        raise ValueError(f"segments must be >= 1, and > 1 only with dynamic tables, got "
                         f"{segments}")
    meta = json.loads((src / "meta.json").read_text())
    if any(f.get("pooling") for f in meta["features"]):
        raise ValueError(f"{src}: multi-hot features are not rewritten here")
    if dst.exists():
        shutil.rmtree(dst)
    train_rows = meta["splits"]["train"]["rows"]
    for split, info in meta["splits"].items():
        (dst / split).mkdir(parents=True)
        first = 0  # the part's first row in its split
        for part in info["parts"]:
            paths = part_paths(src / split, part["name"])
            for kind in ("dense", "label"):
                _link_or_copy(paths[kind], dst / split / paths[kind].name)
            ids = np.load(paths["sparse"], allow_pickle=False)
            if split == "train":
                row = np.arange(first, first + len(ids), dtype=np.int64)
                seg = row * segments // train_rows
            else:
                seg = np.full(len(ids), segments - 1)
            first += len(ids)
            offset = seg.astype(np.uint64) * np.uint64(SEGMENT_STRIDE)
            np.save(dst / split / paths["sparse"].name,
                    hashed_ids(ids, rows=rows, dynamic=dynamic, offset=offset),
                    allow_pickle=False)
    meta["tables"] = [{**{k: v for k, v in t.items() if k != "kind"}, "rows": rows,
                       **({"kind": "dynamic"} if dynamic else {})} for t in meta["tables"]]
    meta["id_dtype"] = "int64" if dynamic else "int32"
    meta["source"] = {**(meta.get("source") or {}), "derived": {
        "from": str(src), "tables": "dynamic" if dynamic else "fixed", "rows": rows,
        "segments": segments, "segment_stride": SEGMENT_STRIDE,
        "ids": ("splitmix64(id + segment * stride) as int64, 0 -> 1" if dynamic
                else "1 + splitmix64(id) % (rows - 1)")}}
    (dst / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return dst


def _link_or_copy(a: Path, b: Path) -> None:
    try:
        os.link(a, b)
    except OSError:
        shutil.copyfile(a, b)


def table_ids(root: Path, split: str) -> np.ndarray:
    """A split's ids, [rows, tables], in row order."""
    meta = json.loads((root / "meta.json").read_text())
    return np.concatenate([np.load(part_paths(root / split, p["name"])["sparse"])
                           for p in meta["splits"][split]["parts"]])


def id_counts(root: Path) -> dict:
    """Per table: distinct ids in train, in train and eval together; the train row at which the
    table has seen ``k`` distinct ids is ``first_seen[t][k - 1]`` (sorted first occurrences)."""
    train, evl = table_ids(root, "train"), table_ids(root, "eval")
    out = {"train": [], "all": [], "first_seen": []}
    for t in range(train.shape[1]):
        ids, first = np.unique(train[:, t], return_index=True)
        out["train"].append(len(ids))
        out["all"].append(len(np.union1d(ids, evl[:, t])))
        out["first_seen"].append(np.sort(first))
    return out


def shared_collisions() -> dict | None:
    """Per shared sample with its preset (``SAMPLES``): distinct values and collisions with
    dynamic and fixed tables (recsync.data.collisions); None where ../shared/data is absent."""
    from recsync.data.collisions import count_collisions
    from recsync.data.schema import load_preset
    if not SHARED_DATA.is_dir():
        return None
    out = {}
    for preset, files in SAMPLES:
        paths = [SHARED_DATA / f for f in files.split()]
        if not all(p.is_file() for p in paths):
            continue
        got = count_collisions(paths, load_preset(preset))
        out[files.split("/")[0]] = {
            "preset": preset, "tables": len(got), "values": sum(t.values for t in got),
            "dynamic": sum(t.dynamic_collisions for t in got),
            "fixed": sum(t.fixed_collisions for t in got)}
    return out
