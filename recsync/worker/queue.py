"""The work queue: chunks of training data handed to whichever worker asks next.

Fast workers take more chunks. A chunk is leased to one worker until it reports it done; if the
worker dies, ``release`` puts its leased chunks back at the front, so every chunk of every epoch
is completed exactly once (the rows of a chunk a worker had started may be trained on again).
A worker whose threads train in parallel (Hogwild) holds one lease per thread (``slot``).
"""

from __future__ import annotations

from collections import Counter, deque

import ray

from recsync.data.reader import Chunk

Item = tuple[int, Chunk]  # (epoch, chunk)


class ChunkQueue:
    def __init__(self, items: list[Item]):
        self.pending: deque[Item] = deque(items)
        self.leased: dict[tuple[int, int], Item] = {}  # (worker, slot) -> item
        self.completed: Counter = Counter()       # item -> times completed (must end at 1)
        self.by_worker: dict[int, dict] = {}

    def take(self, worker: int, slot: int = 0) -> Item | None:
        """The next item for ``worker``'s thread ``slot`` (None when none is left). One lease
        per slot: taking again before ``done`` is a bug in the caller."""
        if (worker, slot) in self.leased:
            raise RuntimeError(f"worker {worker} (slot {slot}) takes a chunk while holding "
                               f"{self.leased[worker, slot]}")
        if not self.pending:
            return None
        item = self.pending.popleft()
        self.leased[worker, slot] = item
        return item

    def done(self, worker: int, item: Item, slot: int = 0) -> None:
        if self.leased.get((worker, slot)) != item:
            raise RuntimeError(f"worker {worker} (slot {slot}) reports {item} done but holds "
                               f"{self.leased.get((worker, slot))}")
        del self.leased[worker, slot]
        self.completed[item] += 1
        stats = self.by_worker.setdefault(worker, {"chunks": 0, "samples": 0})
        stats["chunks"] += 1
        stats["samples"] += item[1].rows

    def release(self, worker: int) -> list[Item]:
        """A worker died: its leased items go back to the front of the queue (in the order
        they were taken). Returns them."""
        keys = [k for k in self.leased if k[0] == worker]
        items = [self.leased.pop(k) for k in keys]
        self.pending.extendleft(reversed(items))
        return items

    def summary(self) -> dict:
        counts = Counter(self.completed.values())
        return {"pending": len(self.pending), "leased": len(self.leased),
                "completed": sum(self.completed.values()),
                "completed_more_than_once": sum(n for c, n in counts.items() if c > 1),
                "by_worker": {str(w): s for w, s in sorted(self.by_worker.items())}}


@ray.remote(num_cpus=0, max_restarts=0)
class WorkQueue:
    """The Ray actor around ChunkQueue."""

    def __init__(self, items: list[Item]):
        self.q = ChunkQueue(items)

    def take(self, worker: int, slot: int = 0) -> Item | None:
        return self.q.take(worker, slot)

    def done(self, worker: int, item: Item, slot: int = 0) -> None:
        self.q.done(worker, item, slot)

    def release(self, worker: int) -> list[Item]:
        return self.q.release(worker)

    def summary(self) -> dict:
        return self.q.summary()
