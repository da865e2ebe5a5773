"""The work queue: chunks of training data handed to whichever worker asks next.

Fast workers take more chunks. A chunk is leased to one worker until it reports it done; if the
worker dies, ``release`` puts its leased chunk back at the front, so every chunk of every epoch
is completed exactly once (the rows of a chunk a worker had started may be trained on again).
"""

from __future__ import annotations

from collections import Counter, deque

import ray

from recsync.data.reader import Chunk

Item = tuple[int, Chunk]  # (epoch, chunk)


class ChunkQueue:
    def __init__(self, items: list[Item]):
        self.pending: deque[Item] = deque(items)
        self.leased: dict[int, Item] = {}
        self.completed: Counter = Counter()       # item -> times completed (must end at 1)
        self.by_worker: dict[int, dict] = {}

    def take(self, worker: int) -> Item | None:
        """The next item for ``worker`` (None when none is left). One lease per worker: taking
        again before ``done`` is a bug in the caller."""
        if worker in self.leased:
            raise RuntimeError(f"worker {worker} takes a chunk while holding {self.leased[worker]}")
        if not self.pending:
            return None
        item = self.pending.popleft()
        self.leased[worker] = item
        return item

    def done(self, worker: int, item: Item) -> None:
        if self.leased.get(worker) != item:
            raise RuntimeError(f"worker {worker} reports {item} done but holds "
                               f"{self.leased.get(worker)}")
        del self.leased[worker]
        self.completed[item] += 1
        stats = self.by_worker.setdefault(worker, {"chunks": 0, "samples": 0})
        stats["chunks"] += 1
        stats["samples"] += item[1].rows

    def release(self, worker: int) -> Item | None:
        """A worker died: its leased item goes back to the front of the queue."""
        item = self.leased.pop(worker, None)
        if item is not None:
            self.pending.appendleft(item)
        return item

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

    def take(self, worker: int) -> Item | None:
        return self.q.take(worker)

    def done(self, worker: int, item: Item) -> None:
        self.q.done(worker, item)

    def release(self, worker: int) -> Item | None:
        return self.q.release(worker)

    def summary(self) -> dict:
        return self.q.summary()
