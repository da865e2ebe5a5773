"""The arithmetic of recoveries as plain functions (no Ray): where a rebuilt group starts and
which shards skip a step, what a shard's restart from its own checkpoint lost, and what a
rollback's lost work costs in time."""

from __future__ import annotations

from typing import NamedTuple


class RebuildPoint(NamedTuple):
    """Where a rebuilt group starts: ``step``, the step the PS completed on some shard;
    ``lagging``, the shards that had not completed it (they skip its row update); ``known``,
    whether the live replica holds its dense state at that step."""

    step: int
    lagging: list[int]
    known: bool


def rebuild_point(versions: list[int], known_steps) -> RebuildPoint:
    """The step a group rebuilt after a worker's death starts from, given the shards'
    ``versions`` and the steps whose dense state the live replica holds (``known_steps``).

    A worker that dies between its pushes to the shards leaves its last step complete on some
    shards only. The group goes on after that step (the dense replicas took it); the shards
    that missed it skip it, losing that step's row update."""
    step = max(versions)
    return RebuildPoint(step, [i for i, v in enumerate(versions) if v < step],
                        step in known_steps)


def partial_loss(version_before: int, restored_version: int, per_update: int) -> tuple[int, int]:
    """(updates, samples) a shard lost by restarting from its own checkpoint at
    ``restored_version``: the updates it had applied since, up to the last version the driver
    saw (``version_before``), each one update's ``per_update`` samples."""
    updates = max(0, version_before - restored_version)
    return updates, updates * per_update


def training_rate(recent, until_unix: float) -> float:
    """Samples per second over the polls in ``recent`` ((epoch s, samples) pairs, oldest first)
    up to ``until_unix``; 0.0 without two polls apart in time."""
    before = [(t, n) for t, n in recent if t <= until_unix]
    if len(before) >= 2 and before[-1][0] > before[0][0]:
        return (before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])
    return 0.0


def lost_work_s(redone_samples: int, rate: float, failed_unix: float, checkpoint_unix: float,
                resumed_unix: float) -> float:
    """The training time a rollback loses: the samples done again at the training ``rate``
    before the failure (the samples of a chunk leased at the checkpoint are redone too: more
    than the time since it), else, without a rate, the time from the later of the checkpoint
    and the previous rollback (``resumed_unix``) to the failure."""
    if rate > 0:
        return redone_samples / rate
    return max(0.0, failed_unix - max(checkpoint_unix, resumed_unix))
