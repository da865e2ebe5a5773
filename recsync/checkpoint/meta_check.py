"""The types of a checkpoint manifest's meta, checked when it is loaded (files.load), so that
what reads a field later (resume, full recovery, resharding, a shard's restore) never meets a
string where it counts, a list where it looks a key up, or a number too big for an array.

Every field a reader uses is checked where it is present, by name, whichever checkpoint holds
it: a job checkpoint's (job.py: ``final``, ``shard_sequences``, ``queue``, ``done``, ...) and a
shard's (ps/core.py snapshot: ``version``, ``tables``, ``staleness``, ``rule``, ...). A field
that a reader needs and the meta lacks is said when it is read (manifest.Meta): old checkpoints
lack some, and which are needed depends on the reader. Other keys are left alone. Errors are
one line naming the manifest and the key.
"""

from __future__ import annotations

import math

from recsync.data.meta_checks import MAX_MODEL_TABLES
from recsync.safe_names import printable

MAX_INT = 2**63 - 1   # what an int64 holds: counters, positions, sequences
MAX_DEPTH = 64        # nesting of lists and objects in a manifest
MAX_TABLES = MAX_MODEL_TABLES  # embedding tables in one shard checkpoint: a model's


class Bad(ValueError):
    """A meta value of the wrong type; ``str`` is the problem, without the manifest."""


def _int(v, low: int = 0, high: int = MAX_INT) -> int:
    if type(v) is not int or not low <= v <= high:
        raise Bad(f"is {printable(v)}, not an integer in [{low}, {high}]")
    return v


def _count(v) -> int:
    """A count a run derives (a rank's samples and steps since the last completed chunk): any
    int64, as a reader only adds or compares it (never refuse what a run wrote)."""
    return _int(v, -MAX_INT)


def _num(v) -> float:
    if type(v) not in (int, float) or not math.isfinite(v):
        raise Bad(f"is {printable(v)}, not a finite number")
    return v


def _typed(kind: type, said: str):
    """A check that a value is a ``kind`` (its message: "is X, not ``said``")."""
    def check(v):
        if not isinstance(v, kind):
            raise Bad(f"is {printable(v)}, not {said}")
        return v
    return check


_str, _bool, _dict = _typed(str, "a string"), _typed(bool, "true or false"), \
    _typed(dict, "an object")


def _list(v, item=None, *, at_least: int = 0, exactly: int | None = None) -> list:
    if exactly is not None and (not isinstance(v, list) or len(v) != exactly):
        raise Bad(f"is {printable(v)}, not a list of {exactly}")
    if not isinstance(v, list) or len(v) < at_least:
        raise Bad(f"is {printable(v)}, not a list" + (f" of at least {at_least}" if at_least
                                                      else ""))
    if item is not None:
        for i, x in enumerate(v):
            _within(f"[{i}]", item, x)
    return v


def _within(where: str, check, value) -> None:
    try:
        check(value)
    except Bad as e:
        raise Bad(f"{where} {e}") from None


def _keys(v, checks: dict) -> dict:
    """An object holding every key of ``checks``, each passing its check."""
    _dict(v)
    for key, check in checks.items():
        if key not in v:
            raise Bad(f"lacks {key!r}")
        _within(f"[{key!r}]", check, v[key])
    return v


def _optional(check):
    return lambda v: None if v is None else check(v)


def _item(v) -> None:
    """A work-queue item: [epoch, split, part, start, stop] (worker/queue.py)."""
    _list(v, exactly=5)
    for i, part_check in enumerate((_int, _str, _int, _int, _int)):
        _within(f"[{i}]", part_check, v[i])


def _lease(v) -> None:  # [item, rows trained (batches before position_unit), [worker, slot]]
    _list(v, at_least=2)
    _within("[0]", _item, v[0])
    _within("[1]", _int, v[1])


def _completed(v) -> None:  # [item, times]
    _list(v, exactly=2)
    _within("[0]", _item, v[0])
    _within("[1]", _int, v[1])


def _rank(v: str) -> None:
    if not (isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 18):
        raise Bad(f"has key {printable(v)}, not a decimal number")


def _counts_by_key(value_check):
    def check(v) -> None:
        for key, x in _dict(v).items():
            _rank(key)
            _within(f"[{key!r}]", value_check, x)
    return check


def _queue(v) -> None:
    _keys(v, {"pending": lambda x: _list(x, _item),
              "leased": lambda x: _list(x, _lease),
              "completed": lambda x: _list(x, _completed),
              "by_worker": _counts_by_key(lambda x: _keys(x, {"chunks": _count,
                                                              "samples": _count}))})
    if "position_unit" in v and v["position_unit"] not in ("rows", "batches"):
        raise Bad(f"has ['position_unit'] {printable(v['position_unit'])}, not \"rows\"")
    if "pending_skip" in v:  # [item, rows trained] of pending items (worker/queue.py)
        _within("['pending_skip']", lambda x: _list(x, _completed), v["pending_skip"])


def _groups(v) -> None:
    """An optimizer's param_groups: objects each naming its parameters by index."""
    _list(v, lambda g: _keys(g, {"params": lambda p: _list(p, _int)}))


def _dense_optimizer(v) -> None:
    _keys(v, {"class": _str, "param_groups": _groups})


def _named_counts(v) -> None:  # GBA's {"applied": n, ...}
    for key, n in _dict(v).items():
        _within(f"[{printable(key)!r}]", _count, n)


def _rule(v) -> None:
    _dict(v)
    if "counts" in v:  # GBA
        _within("['counts']", _named_counts, v["counts"])
    if "pushes" in v:  # EASGD
        _within("['pushes']", _count, v["pushes"])


FIELDS = {
    # job checkpoints (distributed/checkpoints.py writes them, job.py reads them)
    "final": _bool,
    "shard_sequences": lambda v: _list(v, lambda s: _int(s, 1), at_least=1),
    "step_index": _int,
    "queue": _queue,
    "unix": _num,
    "done": lambda v: _list(v, lambda d: _keys(d, {"samples": _count, "steps": _count})),
    "samples": _count,
    "steps": _count,
    "train_s": _num,
    "dense_param_groups": _optional(_groups),
    "config": _dict,
    "mode": _str,
    # shard checkpoints (ps/core.py snapshot)
    "version": _int,
    "pulls": _int,
    "pushes": _int,
    "samples_applied": _int,
    "staleness": _counts_by_key(_int),
    "tables": lambda v: _int(v, 0, MAX_TABLES),
    "shard": _int,
    "num_shards": lambda v: _int(v, 1),
    "dense_optimizer": _optional(_dense_optimizer),
    "partial": _optional(_str),
    "rows": _optional(_int),
    "rule": _rule,
}


def depth_ok(value, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and objects nest at most ``limit`` deep in ``value`` (without recursion:
    a deeper one would make what reads it recurse)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def check(meta, sequence: int, where: str) -> None:
    """ValueError (one line naming ``where``, the manifest, and the key) where ``meta`` of
    checkpoint ``sequence`` is not an object or a field it holds has the wrong type."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: meta is {printable(meta)}, not an object")
    for key, field_check in FIELDS.items():
        if key in meta:
            try:
                field_check(meta[key])
            except Bad as e:
                raise ValueError(f"{where}: meta[{key!r}] {e}") from None
    if "base" in meta:  # a partial checkpoint's full one: not after it
        try:
            _int(meta["base"], 1, sequence)
        except Bad as e:
            raise ValueError(f"{where}: meta['base'] {e}") from None
    if meta.get("partial") and "base" not in meta:
        raise ValueError(f"{where}: meta['partial'] is {printable(meta['partial'])} but meta "
                         f"has no 'base' (the full checkpoint it applies to)")
    if "shard" in meta and "num_shards" in meta and meta["shard"] >= meta["num_shards"]:
        raise ValueError(f"{where}: meta['shard'] is {meta['shard']}, not below "
                         f"meta['num_shards'] ({meta['num_shards']})")


def check_rows(arrays: dict, meta: dict, where: str) -> None:
    """A shard checkpoint's rows as restoring and resharding read them: per table
    (``meta["tables"]``) integer local indices ``t{t}.local`` (>= 0) and as many ``weights``
    and ``state`` rows (a dynamic table's also ``ids``, ``counts``, ``last`` and ``clock``, and
    in a partial checkpoint ``gone``, its tombstones);
    ValueError naming ``where`` (the manifest) and the array otherwise."""
    for t in range(meta["tables"]):
        local = arrays.get(f"t{t}.local")
        if local is None or local.ndim != 1 or local.dtype.kind not in "iu" \
                or (len(local) and local.min() < 0):
            raise ValueError(f"{where}: t{t}.local is missing or not a list of row indices")
        for part in ("weights", "state"):
            a = arrays.get(f"t{t}.{part}")
            if a is None or a.ndim < 1 or len(a) != len(local) or a.dtype.kind not in "fiu":
                raise ValueError(f"{where}: t{t}.{part} is missing or has not one numeric "
                                 f"row per index of t{t}.local")
        if f"t{t}.ids" in arrays:  # a dynamic table's: each row's id and scores, its clock
            for part in ("ids", "counts", "last"):
                a = arrays.get(f"t{t}.{part}")
                if a is None or a.ndim != 1 or len(a) != len(local) or a.dtype.kind not in "iu":
                    raise ValueError(f"{where}: t{t}.{part} is missing or has not one integer "
                                     f"per index of t{t}.local")
            clock = arrays.get(f"t{t}.clock")
            if clock is None or clock.ndim != 0 or clock.dtype.kind not in "iu":
                raise ValueError(f"{where}: t{t}.clock is missing or not one integer")
            gone = arrays.get(f"t{t}.gone")  # a partial checkpoint's tombstones (ids)
            if gone is not None and (gone.ndim != 1 or gone.dtype.kind not in "iu"):
                raise ValueError(f"{where}: t{t}.gone is not a list of ids")
