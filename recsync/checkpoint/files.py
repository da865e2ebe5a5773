"""Checkpoint files: written atomically with a checksum, loaded without unpickling anything.

A checkpoint is two files in one directory:

- ``ckpt-000012.npz``: the arrays (numpy's uncompressed zip of ``.npy`` members);
- ``ckpt-000012.json``: its manifest: format, sequence number, the data file's name, size and
  SHA-256, and the checkpoint's metadata (plain JSON).

Each is written to a temporary name, flushed and fsynced, then renamed into place (and the
directory fsynced), the data file first. So a checkpoint is complete if and only if its
manifest exists and the data file matches it; a process killed while writing leaves at most a
temporary file or a data file without a manifest, which loading ignores. Loading reads JSON and
``np.load(allow_pickle=False)``: a checkpoint cannot run code. A corrupt or partial checkpoint
raises CheckpointError naming the file and the problem; ``latest`` then falls back to the
newest older checkpoint that is complete, and says what it skipped.

A partial checkpoint (CPR-MFU, CPR-SSU: only some rows) names the full checkpoint it applies to
in ``meta["base"]``; restoring it means the base, then every checkpoint after the base up to it,
in order (``chain``). ``prune`` keeps every checkpoint a retained one needs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "recsync-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{6,})\.json$")


class CheckpointError(ValueError):
    """A checkpoint is missing, partial or corrupt; the message names the file and why."""


@dataclass
class Checkpoint:
    sequence: int
    arrays: dict[str, np.ndarray]
    meta: dict
    manifest_path: Path
    skipped: list[str] = field(default_factory=list)  # newer checkpoints ``latest`` passed over


def fsync_path(path: Path) -> None:
    """A file's, or a directory's (its entries'), writes onto the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_path(path.parent)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_path(directory: str | Path, sequence: int) -> Path:
    return Path(directory) / f"ckpt-{sequence:06d}.json"


def write(directory: str | Path, sequence: int, arrays: dict[str, np.ndarray],
          meta: dict, before_manifest: Callable[[], None] | None = None) -> Path:
    """Write checkpoint ``sequence`` into ``directory``; returns the manifest's path.
    ``before_manifest``: called once the data file is written (fault injection)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = manifest_path(directory, sequence)
    data = path.with_suffix(".npz")
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray) or a.dtype == object:
            raise TypeError(f"checkpoint array {name!r} must be a numeric numpy array, got "
                            f"{type(a).__name__}")
    _write_atomically(data, lambda f: np.savez(f, **arrays))
    if before_manifest is not None:
        before_manifest()
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "sequence": sequence,
                "data_file": data.name, "bytes": data.stat().st_size, "sha256": _sha256(data),
                "created_unix": time.time(), "meta": meta}
    _write_atomically(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    return path


def load(manifest_path: str | Path) -> Checkpoint:
    """Load one checkpoint, checking it whole; raises CheckpointError naming what is wrong."""
    path = Path(manifest_path)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint manifest") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: the manifest is not valid JSON ({e}); the checkpoint "
                              f"is partial or corrupt") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a recsync checkpoint manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version "
                              f"{manifest.get('format_version')}, this recsync reads "
                              f"{FORMAT_VERSION}")
    missing = [k for k in ("sequence", "data_file", "bytes", "sha256", "meta")
               if k not in manifest]
    if missing:
        raise CheckpointError(f"{path}: the manifest lacks {', '.join(missing)}")
    data = path.parent / manifest["data_file"]
    if not data.exists():
        raise CheckpointError(f"{data}: the data file of checkpoint {path.name} is missing")
    size = data.stat().st_size
    if size != manifest["bytes"]:
        raise CheckpointError(f"{data}: {size} bytes, the manifest says {manifest['bytes']} "
                              f"(truncated or overwritten)")
    if _sha256(data) != manifest["sha256"]:
        raise CheckpointError(f"{data}: checksum mismatch (SHA-256 differs from the "
                              f"manifest's): the file is corrupt")
    try:
        with np.load(data, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{data}: cannot be read as numeric arrays ({e})") from None
    return Checkpoint(manifest["sequence"], arrays, manifest["meta"], path)


def manifests(directory: str | Path) -> list[Path]:
    """The manifests in ``directory``, newest (highest sequence) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def _base(meta: dict, sequence: int) -> int:
    """The full checkpoint a checkpoint applies to (itself if it is full)."""
    return int(meta.get("base", sequence))


def chain(directory: str | Path, sequence: int) -> list[Checkpoint]:
    """Checkpoint ``sequence`` with what restoring it needs: [its base, the partial ones after
    the base, ..., it] (just [it] if it is full). Raises CheckpointError if any fails to load."""
    last = load(manifest_path(directory, sequence))
    base = _base(last.meta, sequence)
    out = [load(manifest_path(directory, s)) for s in range(base, sequence)]
    return out + [last]


def latest(directory: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint in ``directory`` (None if there is none). Newer ones that
    fail to load are listed, with why, in ``skipped`` (and of the returned one)."""
    found = latest_chain(directory)
    return found[-1] if found else None


def interrupted(directory: str | Path) -> list[int]:
    """Sequences whose data file is in ``directory`` without its manifest, newer than every
    complete checkpoint: writes that a crash interrupted (the manifest is written last)."""
    directory = Path(directory)
    found = manifests(directory)
    newest = int(_NAME.match(found[0].name).group(1)) if found else 0
    data = [int(p.stem.split("-")[1]) for p in directory.glob("ckpt-*.npz")] \
        if directory.is_dir() else []
    return sorted(s for s in data if s > newest)


def latest_chain(directory: str | Path) -> list[Checkpoint]:
    """``chain`` of the newest checkpoint whose chain loads ([] if there is none); the last
    one's ``skipped`` says which newer ones were passed over and why."""
    skipped = []
    for path in manifests(directory):
        try:
            found = chain(directory, int(_NAME.match(path.name).group(1)))
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        found[-1].skipped = skipped
        return found
    if skipped:
        raise CheckpointError(f"{directory}: no complete checkpoint; "
                              + "; ".join(skipped))
    return []


def prune(directory: str | Path, keep: int, keep_from: int | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints, those from sequence ``keep_from`` on
    (e.g. named by a job checkpoint still kept) and what they need to be restored (the base
    of a partial one and the checkpoints between), and other processes' temporary files;
    returns the manifests deleted. Call it after writing a checkpoint, which is then the newest
    and complete."""
    directory = Path(directory)
    removed = []
    found = manifests(directory)
    needed = int(_NAME.match(found[min(keep, len(found)) - 1].name).group(1)) if found else 0
    if keep_from is not None:
        needed = min(needed, keep_from)
        found_kept = [p for p in found if int(_NAME.match(p.name).group(1)) >= needed]
    else:
        found_kept = found[:keep]
    for path in found_kept:
        try:
            meta = json.loads(path.read_text())["meta"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a broken one needs nothing; loading it will say what is wrong
        needed = min(needed, _base(meta, int(_NAME.match(path.name).group(1))))
    for path in found[keep:]:
        if int(_NAME.match(path.name).group(1)) >= needed:
            continue
        data = path.with_suffix(".npz")
        path.unlink(missing_ok=True)  # the manifest first: never a manifest without its data
        data.unlink(missing_ok=True)
        removed.append(path)
    for tmp in directory.glob(".ckpt-*.tmp-*"):
        try:
            pid = int(tmp.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if pid != os.getpid():  # another (dead) writer's leftovers
            tmp.unlink(missing_ok=True)
    return removed
