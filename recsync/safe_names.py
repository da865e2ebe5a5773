"""Names read from outside (remote listings, checkpoint manifests, model.json, meta.json) and
text echoed from untrusted files, made safe before use.

Every reader that joins a name it did not choose onto a folder goes through ``inside``: the
name must be relative, and the path it gives, with every symlink resolved, must stay inside
the folder (itself resolved). So ``../x``, an absolute path, ``/dev/zero`` or a symlink that
points elsewhere is refused with one line naming the file that held the name. ``printable``
escapes control characters and cuts long values, for every message that quotes input.
"""

from __future__ import annotations

from pathlib import Path

MAX_SHOWN = 80  # characters of an untrusted value quoted in a message


class UnsafeName(ValueError):
    """A name that would leave its folder, or is not a plain relative name."""


def printable(value, limit: int = MAX_SHOWN) -> str:
    """``repr``-like text of ``value`` for a one-line message: control characters and other
    unprintable ones escaped, at most ``limit`` characters (then '...')."""
    text = value if isinstance(value, str) else repr(value)
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                  for c in text)
    return out if len(out) <= limit else out[:limit] + "..."


def check_relative(name, *, where: str, what: str = "file name") -> str:
    """``name`` as a relative POSIX name with no '..', '.', empty or absolute part, no
    backslash or NUL; UnsafeName naming ``where`` (the file or listing that held it)."""
    if not isinstance(name, str) or not name:
        raise UnsafeName(f"{where}: bad {what} {printable(name)} (a non-empty string)")
    if "\\" in name or "\x00" in name or any(not c.isprintable() for c in name):
        raise UnsafeName(f"{where}: bad {what} {printable(name)} (plain characters only)")
    parts = name.split("/")  # not PurePosixPath: it drops "." parts and merges "//"
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeName(f"{where}: {what} {printable(name)} is not a plain relative name "
                         f"inside its folder")
    return name


def inside(root: str | Path, name, *, where: str, what: str = "file name",
           plain: bool = False) -> Path:
    """``root / name``, checked to stay inside ``root`` after resolving symlinks (a path that
    does not exist yet is checked through its deepest existing parent). ``plain``: ``name``
    must be one path component (no '/'). UnsafeName naming ``where`` otherwise."""
    check_relative(name, where=where, what=what)
    if plain and "/" in name:
        raise UnsafeName(f"{where}: {what} {printable(name)} must be a plain name in its "
                         f"folder, without '/'")
    base = Path(root).resolve()
    target = (base / name).resolve()  # strict=False: resolves what exists, keeps the rest
    if target != base and base not in target.parents:
        raise UnsafeName(f"{where}: {what} {printable(name)} leads outside {base} "
                         f"(to {printable(str(target), 200)})")
    return target


def regular_file(path: Path, *, where: str, what: str = "file") -> Path:
    """``path`` if it is a regular file (not a device, FIFO or folder: reading one could hang
    or never end); UnsafeName naming ``where`` otherwise. A missing file is left to the
    caller (FileNotFoundError when it opens it)."""
    if path.exists() and not path.is_file():
        raise UnsafeName(f"{where}: {what} {printable(str(path), 200)} is not a regular file")
    return path
