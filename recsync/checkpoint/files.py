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

A checkpoint folder may come from elsewhere (``--resume URL``, a standby fetching a shard's
checkpoints), so nothing in a manifest is trusted: its data file must be this checkpoint's own,
``ckpt-NNNNNN.npz`` of the manifest's sequence, a regular file in the same folder (a symlink
leading out, ``../x``, ``/dev/zero`` or a FIFO is refused before anything is opened or hashed),
of the size the manifest says before it is hashed, its members stored uncompressed; its meta's
fields are type-checked (meta_check.py), a missing one said when a reader needs it
(``Meta``; the safe reading is manifest.py);
``meta_sha256`` (SHA-256 of the meta's canonical JSON; absent from manifests written before it)
catches a meta edited or damaged by accident, and is no signature.

A partial checkpoint (CPR-MFU, CPR-SSU: only some rows) names the full checkpoint it applies to
in ``meta["base"]``; restoring it means the base, then every checkpoint after the base up to it,
in order (``chain``). ``prune`` keeps every checkpoint a retained one needs.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recsync.checkpoint import meta_check
from recsync.checkpoint.manifest import (FORMAT, CheckpointError, as_meta, check_stored,
                                         inside_folder, is_digest, meta_digest, open_regular,
                                         read_manifest, sha256_of)
from recsync.safe_names import printable

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-([0-9]{6,18})\.json$", re.ASCII)


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
    with open(path, "rb") as f:
        return sha256_of(f)


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
    plain = json.loads(json.dumps(meta))  # as a reader will see it (e.g. int keys: str)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "sequence": sequence,
                "data_file": data.name, "bytes": data.stat().st_size, "sha256": _sha256(data),
                "created_unix": time.time(), "meta": plain, "meta_sha256": meta_digest(plain)}
    _write_atomically(path, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    return path


def load(manifest_path: str | Path) -> Checkpoint:
    """Load one checkpoint, checking it whole; raises CheckpointError naming what is wrong."""
    path = Path(manifest_path)
    manifest = read_manifest(path)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version "
                              f"{printable(manifest.get('format_version'))}, this recsync "
                              f"reads {FORMAT_VERSION}")
    missing = [k for k in ("sequence", "data_file", "bytes", "sha256", "meta")
               if k not in manifest]
    if missing:
        raise CheckpointError(f"{path}: the manifest lacks {', '.join(missing)}")
    sequence, size_said = manifest["sequence"], manifest["bytes"]
    named = _NAME.match(path.name)
    if type(sequence) is not int or not 0 <= sequence <= meta_check.MAX_INT \
            or (named and int(named.group(1)) != sequence):
        raise CheckpointError(f"{path}: the manifest's sequence is {printable(sequence)}, not "
                              f"the one its name says")
    own = f"ckpt-{sequence:06d}.npz"
    if manifest["data_file"] != own:
        raise CheckpointError(f"{path}: data_file is {printable(manifest['data_file'])}, not "
                              f"{own} (this checkpoint's own, in its folder)")
    if type(size_said) is not int or size_said < 0:
        raise CheckpointError(f"{path}: bytes is {printable(size_said)}, not a size")
    if not is_digest(manifest["sha256"]) or ("meta_sha256" in manifest
                                              and not is_digest(manifest["meta_sha256"])):
        raise CheckpointError(f"{path}: sha256 and meta_sha256 must be SHA-256 hex digests")
    meta = manifest["meta"]
    if "meta_sha256" in manifest and meta_digest(meta) != manifest["meta_sha256"]:
        raise CheckpointError(f"{path}: the meta does not match meta_sha256 (edited or "
                              f"corrupt)")
    try:
        meta_check.check(meta, sequence, str(path))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    shown = path.parent / own
    real = inside_folder(path.parent, own, path, "data file")  # a symlink leading out: refused
    try:
        f, size = open_regular(real, shown, f"data file of checkpoint {path.name}")
    except FileNotFoundError:
        raise CheckpointError(f"{shown}: the data file of checkpoint {path.name} is "
                              f"missing") from None
    with f:  # the size first: never hash what cannot be the file
        if size != size_said:
            raise CheckpointError(f"{shown}: {size} bytes, the manifest says {size_said} "
                                  f"(truncated or overwritten)")
        if sha256_of(f) != manifest["sha256"]:
            raise CheckpointError(f"{shown}: checksum mismatch (SHA-256 differs from the "
                                  f"manifest's): the file is corrupt")
        f.seek(0)
        try:
            check_stored(f, size, shown)
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - bytes from elsewhere: any parse failure
            raise CheckpointError(f"{shown}: cannot be read as numeric arrays "
                                  f"({printable(str(e), 200)})") from None
    if "tables" in meta:  # a shard checkpoint: its rows as restoring reads them
        try:
            meta_check.check_rows(arrays, meta, str(path))
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    return Checkpoint(sequence, arrays, as_meta(meta, str(path)), path)


def manifests(directory: str | Path) -> list[Path]:
    """The manifests in ``directory``, newest (highest sequence) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def _base(meta: dict, sequence: int) -> int:
    """The full checkpoint a checkpoint applies to (itself if it is full; load checked that
    ``base`` is an integer in [1, sequence])."""
    return meta.get("base", sequence)


def chain(directory: str | Path, sequence: int) -> list[Checkpoint]:
    """Checkpoint ``sequence`` with what restoring it needs: [its base, the partial ones after
    the base, ..., it] (just [it] if it is full). Raises CheckpointError if any fails to load."""
    if type(sequence) is not int or not 0 <= sequence <= meta_check.MAX_INT:
        raise CheckpointError(f"{directory}: checkpoint {printable(sequence)} cannot exist")
    last = load(manifest_path(directory, sequence))
    base = _base(last.meta, sequence)
    out = [load(manifest_path(directory, s)) for s in range(base, sequence)] + [last]
    if out[0].meta.get("partial"):
        raise CheckpointError(f"{out[0].manifest_path}: a partial checkpoint where the chain "
                              f"of checkpoint {sequence} needs a full one")
    if len({c.meta.get("tables") for c in out}) > 1:
        raise CheckpointError(f"{last.manifest_path}: its chain's checkpoints hold different "
                              f"numbers of tables")
    return out


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
    data = [int(m.group(1)) for p in directory.glob("ckpt-*.npz")
            if (m := re.match(r"^ckpt-([0-9]{6,18})\.npz$", p.name, re.ASCII))] \
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
        sequence = int(_NAME.match(path.name).group(1))
        try:
            meta = read_manifest(path)["meta"]
            meta_check.check(meta, sequence, str(path))
        except (ValueError, KeyError):  # CheckpointError too
            continue  # a broken one needs nothing; loading it will say what is wrong
        needed = min(needed, _base(meta, sequence))
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
