"""The one output file of `recsync predict` and `recsync export`.

Checked before any work (``check_output``): its folder must exist, an existing file is replaced
only with ``overwrite``, and it may never be one of the command's inputs (a raw file, a file
inside the data set or model directory, the same file under another name): not even with
``overwrite``. It is built beside its name as ``.NAME.tmp-PID`` and appears under its name only
once complete (``publish``); hidden temporary files that dead processes (a SIGKILL, a power
cut) left for the same output are removed first (``remove_stale_temps``).

torch's zip writer (torch.jit.save to a path; torch.export.save to a path or to a Python file)
aborts the whole process with a C++ stack dump (exit 134) when a write fails, e.g. on a full
disk, and leaves its partial file behind.
So torch writes through a ``GuardedFile``: the first failed write's exception is kept (torch
sees a write that succeeded and finishes) and raised once torch has returned, as an OSError
naming the file, after which the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

from recsync.checkpoint.files import fsync_path
from recsync.run.signals import pid_alive

# .NAME.tmp-PID, and .STEM.tmp-PID.SUFFIX as recsync named them before
STALE_TEMP = re.compile(r"^\..+\.tmp-(\d+)(\.[A-Za-z0-9]+)?$")


def check_output(out: str | Path, *, overwrite: bool, inputs=(), option: str = "--out"
                 ) -> Path:
    """``out`` if a command may write it; ValueError, FileNotFoundError or FileExistsError in
    one line naming it otherwise. ``inputs``: the files and folders the command reads."""
    out = Path(out)
    folder = out.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise FileNotFoundError(f"{option} {out}: its folder {folder} {what} (create it "
                                f"first)")
    if out.is_dir():
        raise ValueError(f"{option} {out} is a folder: name the file to write")
    target = out.resolve()  # through symlinks: a link to an input is that input
    for given in inputs:
        source = Path(given).resolve()
        inside = source.is_dir() and source in target.parents
        if target == source or inside or _same_file(out, source):
            where = "is inside" if inside else "is"
            raise ValueError(f"{option} {out} {where} the input {given}: a command never "
                             f"writes over what it reads, not even with --overwrite; name "
                             f"another file")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise FileExistsError(f"{option} {out} exists: pass --overwrite to replace it")
    return out


def _same_file(a: Path, b: Path) -> bool:
    """Hard links to one file."""
    try:
        return a.is_file() and b.is_file() and os.path.samefile(a, b)
    except OSError:
        return False


def temp_path(out: Path) -> Path:
    """Where ``out`` is built: ``.NAME.tmp-PID`` beside it."""
    return out.with_name(f".{out.name}.tmp-{os.getpid()}")


def remove_stale_temps(out: Path) -> list[Path]:
    """Remove the hidden temporary files of ``out`` (``.NAME.tmp-PID``, and
    ``.STEM.tmp-PID.SUFFIX`` as recsync named them before; plain files) whose writer, process
    PID on this machine, is gone; returns those removed. Only ``out``'s own: other outputs'
    temporary files in a shared folder may belong to a live process on another machine."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(out.parent) as entries:
        for entry in entries:
            match = STALE_TEMP.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            pid, suffix = match.group(1), match.group(2) or ""
            if entry.name not in (f".{out.name}.tmp-{pid}", f".{out.stem}.tmp-{pid}{suffix}") \
                    or (suffix and suffix != out.suffix) or pid_alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def publish(tmp: Path, out: Path, *, overwrite: bool) -> None:
    """``tmp`` (complete, fsynced) renamed to ``out``. Without ``overwrite`` a file that
    appeared at ``out`` meanwhile is kept (FileExistsError) rather than replaced."""
    fsync_path(tmp)
    if overwrite:
        os.replace(tmp, out)
    else:
        try:
            os.link(tmp, out)  # fails where out exists, atomically
        except FileExistsError:
            raise FileExistsError(f"--out {out} was created by another process meanwhile: "
                                  f"left as it is (pass --overwrite to replace it)") from None
        except OSError:  # a file system without hard links
            if out.exists() or out.is_symlink():
                raise FileExistsError(f"--out {out} was created by another process "
                                      f"meanwhile: left as it is (pass --overwrite to replace "
                                      f"it)") from None
            os.replace(tmp, out)
        else:
            tmp.unlink()
    with contextlib.suppress(OSError):
        fsync_path(out.parent)


class GuardedFile(io.RawIOBase):
    """A binary file that torch's C++ writer writes through: the first exception a write
    raises (OSError: disk full, I/O error; or a signal's) is kept in ``error`` instead of
    crossing into C++, and later writes are dropped. Closing it leaves ``file`` open."""

    def __init__(self, file):
        super().__init__()
        self.file, self.error = file, None

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if self.error is None:
            try:
                self.file.write(data)
            except BaseException as e:  # noqa: BLE001 - raised once torch has returned
                self.error = e
        return size

    def flush(self) -> None:
        if self.error is None and not self.file.closed:
            try:
                self.file.flush()
            except BaseException as e:  # noqa: BLE001
                self.error = e


def write_file(out: Path, write, *, overwrite: bool) -> int:
    """Build ``out`` by ``write(file)`` (a GuardedFile) in its temporary file, then publish
    it; the temporary file is removed whatever happens. Returns the file's bytes. A failed
    write: OSError "cannot write OUT: REASON"."""
    tmp = temp_path(out)
    try:
        error = None
        try:
            with open(tmp, "wb") as f:
                guarded = GuardedFile(f)
                write(guarded)
                error = guarded.error
        except OSError as e:  # opening, or closing (the flush of what is buffered)
            error = error or e
        if isinstance(error, OSError):
            raise OSError(error.errno, f"cannot write {out}: {error.strerror or error}"
                          ) from None
        if error is not None:
            raise error
        size = tmp.stat().st_size
        publish(tmp, out, overwrite=overwrite)
        return size
    finally:
        tmp.unlink(missing_ok=True)
