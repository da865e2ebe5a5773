"""Resharding a job checkpoint: the shard checkpoints written by S_old shards as the full
snapshots of S_new shards, so that ``recsync train --resume`` can go on with another
``cluster.ps_shards`` (and ``cluster.workers``). Plain functions, tested without Ray.

A shard checkpoint keeps rows by local index (sharding.py): global id = local * S_old + shard.
Each old shard's chain (its full checkpoint and the partial ones after it, CPR) is first
resolved into one full snapshot (the rows the later ones saved win), then its rows go to the
new shard ``id % S_new`` at local index ``id // S_new``, with their row-optimizer state (a
dynamic table's rows keep their ids and scores and take slots 0, 1, ... on the new shard). Only
one old shard's chain is in memory at a time (``snapshot_for`` takes them one by one), besides
the rows the new shard ends up holding.

What is not a row: the dense parameters and their optimizer state (held by shard 0 where the
mode keeps them on the PS) go from old shard 0 to new shard 0; the mode rule's state (EASGD's
center on shard 0, GBA's counters) and the counters of new shard n continue old shard n's
(fresh ones on shards that did not exist); the counters of old shards that no longer exist are
added to new shard 0's, so that the run's totals (pushes, staleness) stay whole. Every new
shard's version is the highest old one: in lock-step modes they are all equal (the step), in
the others a version only measures staleness, which fresh workers read anew.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np

from recsync.checkpoint import files
from recsync.embedding.dynamic_chain import resolve_dynamic

Snapshot = tuple[dict[str, np.ndarray], dict]  # (arrays, meta) as ShardCore.snapshot makes


def resolve_chain(chain: list[Snapshot]) -> Snapshot:
    """A chain [full, partial, ..., partial] as one full snapshot: per table every row any of
    them saved, the latest save of each (a dynamic table's by id, without the ids a later
    checkpoint tombstones: embedding/dynamic_chain.py); the rest (dense state, rule, counters)
    the last one's."""
    if chain[0][1].get("partial"):
        raise ValueError("a chain of snapshots starts with a full one")
    if len(chain) == 1:
        return chain[0]
    arrays, meta = dict(chain[-1][0]), copy.copy(chain[-1][1])  # a manifest.Meta stays one
    for t in range(meta["tables"]):
        if f"t{t}.ids" in arrays:  # a dynamic table: by id, tombstones removing ids
            arrays.pop(f"t{t}.gone", None)
            arrays.update(resolve_dynamic([a for a, _ in chain], t))
            continue
        # newest first: np.unique keeps the first occurrence, i.e. the latest save
        local = np.concatenate([a[f"t{t}.local"] for a, _ in reversed(chain)])
        keep = np.unique(local, return_index=True)[1]
        arrays[f"t{t}.local"] = local[keep]
        for part in ("weights", "state"):
            arrays[f"t{t}.{part}"] = np.concatenate(
                [a[f"t{t}.{part}"] for a, _ in reversed(chain)])[keep]
    meta["partial"] = None
    meta.pop("base", None)
    meta["rows"] = int(sum(len(arrays[f"t{t}.local"]) for t in range(meta["tables"])))
    return arrays, meta


def load_resolved(sources: list[tuple[str, int]]) -> Iterator[Snapshot]:
    """Each old shard's checkpoint chain, resolved, one at a time: ``sources`` are (its
    checkpoint directory, the sequence a job checkpoint names) in old shard order."""
    for directory, sequence in sources:
        chain = files.chain(directory, sequence)  # rows checked (meta_check.check_rows)
        yield resolve_chain([(c.arrays, c.meta) for c in chain])


def snapshot_for(old: Iterable[Snapshot], old_shards: int, shard: int, num_shards: int,
                 fresh_rule: Snapshot, mode: str) -> Snapshot:
    """New shard ``shard`` of ``num_shards``'s full snapshot from the resolved snapshots of the
    ``old_shards`` old shards (in order; iterated once). ``fresh_rule`` and ``mode``: the rule
    state (arrays, meta) and mode of a shard that starts afresh (for new shards beyond the old
    ones)."""
    parts: dict[str, list[np.ndarray]] = {}
    tables = None
    versions, seen = [], 0
    counters = {"pulls": 0, "pushes": 0, "samples_applied": 0}
    staleness: Counter = Counter()
    clocks: dict[int, list[int]] = {}  # dynamic tables: each old shard's clock
    own = None  # the old shard with this index, if any
    dense_arrays, dense_meta = {}, None
    for k, (arrays, meta) in enumerate(old):
        seen += 1
        _check_layout(meta, k, old_shards)
        if tables is None:
            tables = meta["tables"]
        elif meta["tables"] != tables:
            raise ValueError(f"old shard {k}'s checkpoint has {meta['tables']} tables, shard "
                             f"0's {tables}")
        versions.append(meta["version"])
        for t in range(tables):
            if f"t{t}.ids" in arrays:  # a dynamic table: slots are given anew below
                ids = arrays[f"t{t}.ids"].astype(np.int64)
                mine = ids % num_shards == shard
                moved = ("ids", "counts", "last", "weights", "state")
                clocks.setdefault(t, []).append(int(arrays[f"t{t}.clock"]))
            else:
                ids = arrays[f"t{t}.local"].astype(np.int64) * old_shards + k
                mine = ids % num_shards == shard
                parts.setdefault(f"t{t}.local", []).append(ids[mine] // num_shards)
                moved = ("weights", "state")
            for part in moved:
                parts.setdefault(f"t{t}.{part}", []).append(arrays[f"t{t}.{part}"][mine])
        if k == 0 and shard == 0:
            dense_arrays = {n: a for n, a in arrays.items() if n.startswith("dense.")}
            dense_meta = meta["dense_optimizer"]
        if k == shard:
            own = (arrays, meta)
            mode = meta["mode"]
        if k == shard or (shard == 0 and k >= num_shards):
            for key in counters:
                counters[key] += meta[key]
            staleness.update({int(s): n for s, n in meta["staleness"].items()})
    if seen != old_shards:
        raise ValueError(f"{seen} old shard checkpoints given, the job checkpoint names "
                         f"{old_shards}")
    out = {key: np.concatenate(chunks) for key, chunks in parts.items()}
    for t, clock in clocks.items():  # a dynamic table's rows take slots 0, 1, ... in order
        out[f"t{t}.local"] = np.arange(len(out[f"t{t}.ids"]), dtype=np.int64)
        out[f"t{t}.clock"] = np.array(max(clock), np.int64)
    order = {t: np.argsort(out[f"t{t}.local"], kind="stable") for t in range(tables)}
    for key in out:
        if out[key].ndim:  # a dynamic table's clock is a scalar
            out[key] = out[key][order[int(key[1:key.index(".")])]]
    out.update(dense_arrays)
    rule_arrays, rule_meta = ((({n.removeprefix("rule."): a for n, a in own[0].items()
                                 if n.startswith("rule.")}), own[1]["rule"])
                              if own is not None else fresh_rule)
    out.update({f"rule.{n}": a for n, a in rule_arrays.items()})
    meta = {"version": max(versions), **counters, "mode": mode,
            "staleness": {str(s): n for s, n in staleness.items()}, "tables": tables,
            "dense_optimizer": dense_meta, "partial": None, "rule": rule_meta,
            "shard": shard, "num_shards": num_shards,
            "rows": int(sum(len(out[f"t{t}.local"]) for t in range(tables)))}
    return out, meta


def _check_layout(meta: dict, shard: int, num_shards: int) -> None:
    """A shard checkpoint says which shard of how many wrote it (those from before resharding
    do not: their place in the job checkpoint is all there is)."""
    if "num_shards" in meta and (meta["shard"], meta["num_shards"]) != (shard, num_shards):
        raise ValueError(f"the checkpoint named as shard {shard} of {num_shards} was written by "
                         f"shard {meta['shard']} of {meta['num_shards']}")


def fold_counts(done: list[dict], workers: int) -> list[dict]:
    """Per-rank counts of a job checkpoint for ``workers`` ranks: rank r keeps its own; the
    samples of ranks that no longer exist are added to rank r % workers (steps: the larger),
    so that the run's totals stay whole; new ranks start at 0."""
    out = [{"samples": 0, "steps": 0} for _ in range(workers)]
    for r, d in enumerate(done):
        into = out[r % workers]
        into["samples"] += d["samples"]
        into["steps"] = max(into["steps"], d["steps"])
    return out


def fold_queue(state: dict, workers: int) -> dict:
    """A job checkpoint's data position for ``workers`` ranks: the completed chunks counted by
    rank are folded as ``fold_counts`` folds samples (leases all go back to the queue on a
    restore, whoever held them)."""
    by_worker: dict[str, dict] = {}
    for r, s in state["by_worker"].items():
        into = by_worker.setdefault(str(int(r) % workers), {"chunks": 0, "samples": 0})
        into["chunks"] += s["chunks"]
        into["samples"] += s["samples"]
    return {**state, "by_worker": by_worker}
