"""Reading a checkpoint folder that may come from elsewhere (``--resume URL``, a standby
fetching a shard's checkpoints): the manifest read as a regular file of bounded size and
depth inside its folder, the data file opened without following a symlink or blocking on a
FIFO, its zip members checked to be stored uncompressed (no zip bomb), the meta's digest, and
``Meta``, which names the manifest and key a reader needs and the meta lacks. checkpoint/files.py
writes and loads checkpoints with these."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

from recsync.checkpoint import meta_check
from recsync.safe_names import UnsafeName, inside, printable, regular_file

FORMAT = "recsync-checkpoint"
MAX_MANIFEST_BYTES = 256 << 20  # a manifest is JSON of a few MB at most (the data position)


class CheckpointError(ValueError):
    """A checkpoint is missing, partial or corrupt; the message names the file and why."""


class Meta(dict):
    """A checkpoint's meta: a key a reader needs and the manifest lacks is a CheckpointError
    naming the manifest and the key, not a KeyError deep inside the reader."""

    where = "checkpoint manifest"

    def __missing__(self, key):
        raise CheckpointError(f"{self.where}: meta lacks {printable(key)!r} (written by "
                              f"another recsync version, or edited?)")


def as_meta(meta: dict, where: str) -> Meta:
    out = Meta(meta)
    out.where = where
    return out


def meta_digest(meta) -> str:
    """SHA-256 of ``meta``'s canonical JSON (sorted keys, no spaces), as read back from a
    manifest."""
    text = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_of(f) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def open_regular(path: Path, shown: Path, what: str, limit: int | None = None):
    """``path`` (resolved, inside its folder) opened for reading if it is a regular file of at
    most ``limit`` bytes: a FIFO or device is refused, never read (stat before opening; fstat
    after, of a file opened without waiting for a writer). Returns (file, size);
    FileNotFoundError where it is missing."""
    try:  # stat first (a device is not even opened), then fstat what was opened (no race)
        regular_file(path, where=str(shown), what=what)
    except UnsafeName:
        raise CheckpointError(f"{shown}: the {what} is not a regular file") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CheckpointError(f"{shown}: cannot read the {what} ({e.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise CheckpointError(f"{shown}: the {what} is not a regular file")
    if limit is not None and info.st_size > limit:
        os.close(fd)
        raise CheckpointError(f"{shown}: the {what} is {info.st_size} bytes, more than a "
                              f"manifest can be ({limit})")
    return os.fdopen(fd, "rb"), info.st_size


def check_stored(f, size: int, shown: Path) -> None:
    """np.savez writes its members uncompressed: a compressed member (which np.load would
    inflate, a zip bomb from elsewhere) or members larger in all than the file are refused."""
    with zipfile.ZipFile(f) as z:
        members = z.infolist()
    if any(m.compress_type != zipfile.ZIP_STORED for m in members) \
            or sum(m.file_size for m in members) > size:
        raise CheckpointError(f"{shown}: holds compressed or oversized members (a checkpoint's "
                              f"arrays are stored uncompressed)")


def inside_folder(folder: Path, name: str, where: Path, what: str) -> Path:
    try:
        return inside(folder, name, where=str(where), what=what, plain=True)
    except UnsafeName as e:
        raise CheckpointError(str(e)) from None
    except (RuntimeError, OSError) as e:  # a symlink loop
        raise CheckpointError(f"{where}: the {what} {name} cannot be resolved "
                              f"({printable(str(e), 200)})") from None


def read_manifest(path: str | Path) -> dict:
    """A manifest's JSON object, read safely (a regular file in its folder, at most
    MAX_MANIFEST_BYTES, nested at most meta_check.MAX_DEPTH deep); CheckpointError naming
    it otherwise."""
    path = Path(path)
    real = inside_folder(path.parent, path.name, path, "checkpoint manifest")
    try:
        f, _ = open_regular(real, path, "manifest", MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint manifest") from None
    with f:
        raw = f.read()
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, too many digits
        raise CheckpointError(f"{path}: the manifest is not valid JSON "
                              f"({printable(str(e), 200)}); the checkpoint is partial or "
                              f"corrupt") from None
    except RecursionError:
        raise CheckpointError(f"{path}: the manifest is nested too deeply") from None
    if not meta_check.depth_ok(manifest):
        raise CheckpointError(f"{path}: the manifest is nested more than "
                              f"{meta_check.MAX_DEPTH} levels deep")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a recsync checkpoint manifest")
    return manifest


def is_digest(value) -> bool:
    return (isinstance(value, str) and len(value) == 64 and value.isascii()
            and all(c in "0123456789abcdef" for c in value))
