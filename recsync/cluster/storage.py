"""Data, checkpoints and outputs at fsspec URLs (``s3://``, ``gs://``, ``file://``, ...).

recsync reads and writes its files on local disk; a URL says where they live. Every process
works in a local copy, the *staging* folder of the URL: ``RECSYNC_STAGING`` (default
``~/.cache/recsync/remote``) / scheme / bucket / path, the same path on every node, so a
process that holds a staging path knows its URL (``remote_of``). What goes where:

- ``data.path = URL``: each node fetches the data set once (files it lacks, or of another size)
  and reads it locally (``local_data``).
- ``--out URL``: the run writes into the staging folder; config.toml goes up when the run
  starts, each checkpoint as soon as it is complete (the data file, then its manifest: a
  checkpoint is complete where its manifest is), and everything else when the run ends, however
  it ends (``push_tree``). ``--resume URL`` fetches the folder first.
- A shard's checkpoints, written on its node, go up from there; a standby or a restarted shard
  on another node fetches them before it loads (``pull_dir``).

Credentials and endpoints come from the filesystem's usual settings (for S3: the AWS variables,
e.g. AWS_ENDPOINT_URL for an S3-compatible server). A plain path or ``file://`` is used as it
is.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
from pathlib import Path

from recsync.safe_names import UnsafeName, check_relative, inside, printable

log = logging.getLogger(__name__)


class RemoteError(ValueError):
    """A URL that cannot be read or written (no credentials, endpoint unreachable, access
    denied), in one line naming the URL."""


def is_url(path: str | Path) -> bool:
    """A remote URL (not a plain path, not ``file://``)."""
    s = str(path)
    return "://" in s and not s.startswith("file://")


def local(path: str | Path) -> Path:
    """The local path a run reads and writes for ``path``: its staging folder for a URL, the
    path of a ``file://`` URL, else the path itself."""
    s = str(path)
    if s.startswith("file://"):
        return Path(s[len("file://"):])
    if not is_url(s):
        return Path(s)
    scheme, rest = s.split("://", 1)
    parts = [p for p in rest.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"{s}: not a URL of a folder (scheme://bucket/path)")
    return staging_root() / scheme / Path(*parts)


def resume_folder(path: str | Path) -> Path:
    """``--resume DIR`` (a path, ``file://`` URL or remote URL) as a local folder: a remote
    URL's files fetched into its staging folder first. FileNotFoundError where there is none."""
    folder = local(path)
    if is_url(path):
        pull_dir(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--resume {printable(str(path), 200)}: no such directory")
    return folder


def staging_root() -> Path:
    return Path(os.environ.get("RECSYNC_STAGING", Path.home() / ".cache" / "recsync" / "remote"))


def remote_of(path: str | Path) -> str | None:
    """The URL whose staging folder holds ``path``; None for any other path."""
    try:
        rel = Path(path).resolve().relative_to(staging_root().resolve())
    except ValueError:
        return None
    parts = rel.parts
    if len(parts) < 2:
        return None
    return f"{parts[0]}://" + "/".join(parts[1:])


def _fs(url: str):
    """(filesystem, path) of ``url``, its cached listings dropped: other processes write
    there."""
    import fsspec
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:  # e.g. s3fs not installed
        raise ValueError(f"{url}: {e} (pip install 'recsync[s3]' for s3://)") from e
    fs.invalidate_cache()
    return fs, path


def _failure(e: BaseException) -> bool:
    """An error of the remote filesystem itself (not a missing file, which callers handle)."""
    if isinstance(e, FileNotFoundError):
        return False
    if isinstance(e, OSError):
        return True
    botocore = sys.modules.get("botocore.exceptions")
    return botocore is not None and isinstance(e, (botocore.BotoCoreError,
                                                   botocore.ClientError))


@contextlib.contextmanager
def _remote(url: str, doing: str):
    """Errors of the remote filesystem while ``doing`` something at ``url`` as RemoteError
    (one line naming the URL; missing credentials said so)."""
    try:
        yield
    except Exception as e:
        if not _failure(e):
            raise
        why = " ".join(str(e).split()) or type(e).__name__
        if type(e).__name__ == "NoCredentialsError":
            why = (f"no credentials for {url.split('://')[0]}:// ({why}: set AWS_ACCESS_KEY_ID "
                   f"and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
        raise RemoteError(f"{printable(url, 200)}: cannot {doing}: {printable(why, 300)}") \
            from None


def _listed(url: str, root: str, name, info: dict) -> str | None:
    """The relative name of a listing entry ``name`` under ``root`` (None for a folder or
    the root itself); UnsafeName naming the URL and the key where it is not a plain relative
    name under ``root``."""
    prefix = root.rstrip("/") + "/"
    if not isinstance(name, str) or not (name.startswith(prefix) or name == root.rstrip("/")):
        raise UnsafeName(f"{printable(url, 200)}: the listing holds key {printable(name)}, "
                         f"which is not under {printable(root, 200)}")
    rel = name[len(prefix):]
    if not rel or info.get("type") == "directory":
        return None
    check_relative(rel, where=f"{printable(url, 200)}: the listing", what="key")
    return rel


@contextlib.contextmanager
def _node_lock(folder: Path):
    """One process of this node at a time fetches into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pull_dir(path: str | Path, recursive: bool = True) -> int:
    """Fetch into the staging folder ``path`` every file of its URL that it lacks or holds at
    another size (0 and nothing done where ``path`` is not a staging folder). Returns how
    many files were fetched. A listing with a key that would land outside ``path`` (``..``,
    an absolute or empty part, a symlink in ``path`` leading out) is refused whole:
    UnsafeName naming the URL and the key, nothing fetched."""
    url = remote_of(path)
    if url is None:
        return 0
    folder = Path(path)
    fs, root = _fs(url)
    with _node_lock(folder), _remote(url, "fetch it"):
        try:
            listing = (fs.find(root, detail=True) if recursive else
                       {d["name"]: d for d in fs.ls(root, detail=True) if d["type"] == "file"})
        except FileNotFoundError:
            return 0
        wanted = []
        try:  # every key checked before anything is fetched
            for name, info in sorted(listing.items()):
                rel = _listed(url, root, name, info)
                if rel is not None:  # resolved: a symlink in the folder leading out is refused
                    wanted.append((name, info, inside(folder, rel, what="key",
                                                      where=printable(url, 200))))
        except UnsafeName as e:
            raise UnsafeName(f"{e}; nothing fetched") from None
        except RuntimeError as e:  # a symlink loop in the folder
            raise UnsafeName(f"{printable(url, 200)}: {e}; nothing fetched") from None
        fetched = 0
        for name, info, target in wanted:
            if target.exists() and target.stat().st_size == info.get("size"):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.fetch-{os.getpid()}")
            fs.get_file(name, str(tmp))
            os.replace(tmp, target)
            fetched += 1
    return fetched


def local_data(path: str | Path) -> Path:
    """``data.path`` as a local folder: a URL's data set fetched to this node first."""
    folder = local(path)
    if is_url(path):
        fetched = pull_dir(folder)
        if not (folder / "meta.json").exists():
            raise FileNotFoundError(f"data.path = {str(path)!r}: no meta.json there (is it a "
                                    f"converted data set?)")
        if fetched:
            log.info("fetched %d files of %s into %s", fetched, path, folder)
    return folder


def push(paths: list[str | Path]) -> None:
    """Upload each file (in this order) to its URL; files outside a staging folder stay."""
    for p in paths:
        url = remote_of(p)
        if url is not None and Path(p).is_file():
            fs, target = _fs(url)
            with _remote(url, "upload it"):
                fs.put_file(str(p), target)


def push_tree(path: str | Path) -> int:
    """Upload every file under the staging folder ``path`` that its URL lacks or holds at
    another size (temporary files left out, and symlinks leading out of ``path``: what goes
    up is the run's own); how many."""
    url = remote_of(path)
    if url is None:
        return 0
    fs, root = _fs(url)
    with _remote(url, "upload to it"):
        try:
            there = {n: d.get("size") for n, d in fs.find(root, detail=True).items()}
        except FileNotFoundError:
            there = {}
        sent = 0
        for file in sorted(Path(path).rglob("*")):
            if not file.is_file() or file.name.startswith("."):
                continue
            rel = file.relative_to(path).as_posix()
            try:
                inside(path, rel, where=str(path))
            except (UnsafeName, RuntimeError) as e:  # RuntimeError: a symlink loop
                log.warning("not uploaded: %s", e)
                continue
            target = f"{root.rstrip('/')}/{rel}"
            if file.name.startswith("ckpt-") and there.get(target) == file.stat().st_size:
                continue  # a checkpoint's files never change once written
            fs.put_file(str(file), target)
            sent += 1
    return sent


def remove(paths: list[str | Path]) -> None:
    """Delete the URLs of these staging files (their local copies are gone already)."""
    for p in paths:
        url = remote_of(p)
        if url is not None:
            fs, target = _fs(url)
            with _remote(url, "delete it"), contextlib.suppress(FileNotFoundError):
                fs.rm_file(target)


def remote_names(path: str | Path) -> set[str]:
    """The names at the top of the staging folder ``path``'s URL (empty where there is none);
    a listed key that is not a plain name directly under it is left out (and logged)."""
    url = remote_of(path)
    if url is None:
        return set()
    fs, root = _fs(url)
    with _remote(url, "list it"):
        try:
            listing = fs.ls(root, detail=True)
        except FileNotFoundError:
            return set()
    names = set()
    for d in listing:
        try:
            rel = _listed(url, root, str(d.get("name", "")).rstrip("/"), {})
            if rel is not None:
                inside(path, rel, where=f"{printable(url, 200)}: the listing", what="key",
                       plain=True)
                names.add(rel)
        except (UnsafeName, RuntimeError) as e:
            log.warning("left out: %s", e)
    return names


def remote_text(path: str | Path) -> str | None:
    """The text of the staging file ``path``'s URL, read there (None where it has none)."""
    url = remote_of(path)
    if url is None:
        return None
    fs, target = _fs(url)
    with _remote(url, "read it"):
        try:
            return fs.cat_file(target).decode("utf-8", "replace")
        except FileNotFoundError:
            return None


def remove_tree(path: str | Path, names: set[str]) -> None:
    """Delete these names (files or folders) at the top of the staging folder ``path``'s URL;
    UnsafeName (nothing deleted) where one is not a plain name in it ('..', 'a/b', '')."""
    url = remote_of(path)
    if url is None or not names:
        return
    for name in names:
        inside(path, name, where=f"{printable(url, 200)}: names to delete", what="name",
               plain=True)
    fs, root = _fs(url)
    for name in sorted(names):
        with _remote(url, "delete from it"), contextlib.suppress(FileNotFoundError):
            fs.rm(f"{root.rstrip('/')}/{name}", recursive=True)
