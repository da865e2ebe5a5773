"""Where a conversion writes: a temporary directory beside the target, put in its place only
when the data set is complete.

So a data set directory is complete or absent (docs/design.md §4b): a conversion that fails or
is interrupted (Ctrl-C included) leaves the target exactly as it was, and ``overwrite`` replaces
an old data set only once the new one is whole. Nothing but an earlier data set is ever
deleted: a target holding anything else (a user's ``.bak``, notes, other data) is refused.

A conversion killed outright (SIGKILL, a power cut) cannot clean up: the next one into the same
target removes what it left beside it (``.NAME.recsync-tmp-PID-N``, and ``.NAME.recsync-old-PID-N``
once the target is back) when process PID is gone, and says so; a target it was killed while
replacing is put back from its ``-old-`` directory.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recsync.data.format import SPLITS
from recsync.run.signals import pid_alive

# what the writers put in a data set directory (".tmp": a part or meta.json being written)
_TOP_FILES = ("meta.json", "meta.json.tmp")
_PART_FILE = re.compile(
    r"part-[0-9]{5,}\.(dense|sparse|label|weight|multi[0-9]+\.(values|offsets))\.npy(\.tmp)?")
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.recsync-(?P<kind>tmp|old)-(?P<pid>[0-9]+)-[0-9]+")


def foreign_entry(out: Path) -> Path | None:
    """The first entry of directory ``out`` that a data set does not have, or None."""
    for entry in sorted(out.iterdir()):
        if entry.is_symlink():
            return entry
        if entry.name in _TOP_FILES and entry.is_file():
            continue
        if entry.name in SPLITS and entry.is_dir():
            for f in sorted(entry.iterdir()):
                if f.is_symlink() or not (f.is_file() and _PART_FILE.fullmatch(f.name)):
                    return f
            continue
        return entry
    return None


def remove_leftovers(out: str | Path) -> list[Path]:
    """Clean up after conversions into ``out`` that were killed: remove their staging (and
    replaced) directories beside it, or put back the data set one was replacing when killed;
    each said on stderr. Only directories of a process that is gone, and holding nothing but
    data set files, are touched. Returns the paths removed or put back."""
    real = Path(os.path.realpath(out))
    if not real.parent.is_dir():
        return []
    done = []
    for p in sorted(real.parent.glob(f".{glob.escape(real.name)}.recsync-*")):
        m = _LEFTOVER.fullmatch(p.name)
        if (m is None or m["name"] != real.name or p.is_symlink() or not p.is_dir()
                or pid_alive(int(m["pid"])) or foreign_entry(p) is not None):
            continue
        if m["kind"] == "old" and not real.exists() and not real.is_symlink():
            os.rename(p, real)
            print(f"put back {real} from {p}: a conversion (process {m['pid']}) was killed "
                  f"while replacing it", file=sys.stderr)
        else:
            shutil.rmtree(p)
            print(f"removed {p}, left by a conversion (process {m['pid']}) that was killed",
                  file=sys.stderr)
        done.append(p)
    return done


def check_target(out: Path, overwrite: bool) -> None:
    """Refuse a target that holds anything but a data set, or a data set unless ``overwrite``
    (after :func:`remove_leftovers`: a target a killed conversion was replacing is put back).

    Raises FileExistsError naming ``out`` (and the first foreign file)."""
    remove_leftovers(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if not any(out.iterdir()):
        return
    foreign = foreign_entry(out)
    if foreign is not None:
        raise FileExistsError(f"{out} is not empty and not a recsync data set (it holds "
                              f"{foreign}); choose a new or empty --out directory (a conversion "
                              f"replaces only an earlier data set)")
    if not overwrite:
        what = ("a data set (meta.json)" if (out / "meta.json").is_file()
                else "an incomplete data set (no meta.json)")
        raise FileExistsError(f"{out} already holds {what}; pass --overwrite to replace it")


def _unused(parent: Path, stem: str) -> Path:
    for i in itertools.count():
        p = parent / f"{stem}-{os.getpid()}-{i}"
        if not p.exists() and not p.is_symlink():
            return p


@contextmanager
def staged_output(out: str | Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty directory to write a data set into; when the block ends without an
    exception, it replaces ``out``. On an exception (KeyboardInterrupt included) it is removed,
    with any parent directories this call made, and ``out`` is left as it was.

    Raises FileExistsError (see :func:`check_target`) before anything is made, and again at the
    end if ``out`` changed meanwhile. Not safe against another process converting into ``out``
    at the same time.
    """
    out = Path(out)
    check_target(out, overwrite)
    real = Path(os.path.realpath(out))  # a symlinked target: replace what it points to
    made = [p for p in (real.parent, *real.parent.parents) if not p.exists()]
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = _unused(real.parent, f".{real.name}.recsync-tmp")
    try:
        tmp.mkdir()
        if real.is_dir():
            shutil.copymode(real, tmp)  # the user's permissions, not the default ones
        yield tmp
        check_target(out, overwrite)
        _swap_in(tmp, real)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in made:  # deepest first
            try:
                p.rmdir()
            except OSError:
                break
        raise


def _swap_in(new: Path, target: Path) -> None:
    """Put directory ``new`` at ``target``; an old ``target`` (checked: empty or a data set) is
    moved aside first, so a crash in between leaves it whole beside the target."""
    if not target.exists():
        os.rename(new, target)
        return
    old = _unused(target.parent, f".{target.name}.recsync-old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old)
