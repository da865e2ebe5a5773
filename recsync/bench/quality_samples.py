"""The real samples scenario `quality` measures: where they are, which shipped preset converts
each, and why one is skipped (absent, or without labels).

The samples are the shared sample data (``$RECSYNC_SHARED_DATA``, else ``../shared/data``
beside the repository; its README.md and each folder's describe them). They are never in the
repository: a sample that is not there is skipped with a line saying so, as CI may lack it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Sample:
    """One sample folder of the shared data: its input files (read in order as one stream)
    and the shipped preset that converts them (recsync/data/presets)."""

    name: str
    files: tuple[str, ...]
    preset: str
    note: str = ""
    """what a reader of the report should know about its split"""


# Every sample of the shared data, largest first. Each preset's own split applies: avazu and
# movielens hold out the last 20% of the rows, the criteo presets the last 10%, taobao its
# valid file.
SAMPLES = (
    Sample("avazu_head9k", ("avazu_train_head9k.csv",), "avazu"),
    Sample("criteo_kaggle_test_head10k", ("test_head10k.txt",), "criteo"),
    Sample("criteo_kaggle_train_head1k", ("train_head1k.txt",), "criteo"),
    Sample("criteo_sample_deepctr", ("criteo_sample.txt",), "criteo_csv",
           "rows drawn at random from the first 100k lines of Kaggle train.txt: the split is "
           "in file order, not in time"),
    Sample("movielens_sample_deepctr", ("movielens_sample.txt",), "movielens",
           "label rating >= 4 (the preset's threshold); the file is not sorted by timestamp, "
           "so the preset's split (the last 20% of rows in file order) is a random one, not a "
           "time split"),
    Sample("avazu_sample_deepctr", ("avazu_sample.txt",), "avazu"),
    Sample("criteo_raw_paddlerec", ("sample_train.txt",), "criteo"),
    Sample("taobao_tiny_fuxictr", ("train_sample.csv", "valid_sample.csv"), "taobao",
           "the eval split is the sample's own valid file (4 clicks in 100 rows)"),
)


def shared_data_dir() -> Path:
    """Where the shared sample data lives: $RECSYNC_SHARED_DATA, else ../shared/data beside the
    repository."""
    env = os.environ.get("RECSYNC_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def missing_label(path: Path, preset: str) -> str | None:
    """Why ``path`` has no label column for ``preset`` (read from its first line), or None
    where it has one. A headerless file needs every column the preset names, the label
    first among them; a file with a header must name the label column."""
    from recsync.data.schema import load_schema
    schema = load_schema(preset=preset)
    with open(path, newline="") as f:
        first = f.readline().rstrip("\r\n")
    fields = first.split(schema.input.delimiter)
    label = schema.label.column
    if schema.input.header:
        if label not in fields:
            return (f"{path.name}: its header has no column {label!r} (the label of preset "
                    f"{preset})")
        return None
    if len(fields) < len(schema.input.columns):
        return (f"{path.name}: {len(fields)} fields a line, preset {preset} reads "
                f"{len(schema.input.columns)} ({label!r} first): no label column, as in the "
                f"Kaggle test set")
    return None


def skip_reason(sample: Sample, root: Path) -> str | None:
    """Why ``sample`` cannot be measured (a file absent, or no label), or None."""
    folder = root / sample.name
    for name in sample.files:
        if not (folder / name).is_file():
            return (f"{folder / name} is not there (set RECSYNC_SHARED_DATA to the shared "
                    f"sample data directory)")
    return missing_label(folder / sample.files[0], sample.preset)


def available(root: Path, samples=SAMPLES) -> tuple[list[Sample], dict[str, str]]:
    """The samples to measure under ``root``, and {name: the line saying why} for the others."""
    keep, skipped = [], {}
    for s in samples:
        reason = skip_reason(s, root)
        if reason is None:
            keep.append(s)
        else:
            skipped[s.name] = reason
    return keep, skipped


def convert_sample(sample: Sample, root: Path, out: Path) -> Path:
    """Convert ``sample`` with its preset into ``out`` (replaced); the data set's path."""
    import recsync
    recsync.convert([root / sample.name / f for f in sample.files], out, preset=sample.preset,
                    overwrite=True, progress=False)
    return out
