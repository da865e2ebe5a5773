"""The chunks one worker leases from the work queue (worker/queue.py), read as batches, and the
rows of each handed out to training so far: the data position a job checkpoint or a hand over
(a worker leaving an elastic sync run) goes on from."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import ray


class Leases:
    """Worker ``rank``'s leases. ``batch_size()`` is asked as each batch is read (an elastic
    sync run changes a worker's share of the global batch between steps); ``leaving()``: no
    chunk is taken any more (what is held is finished). ``keep_asking``: with the queue empty,
    a step without a batch, and the queue asked again at the next (an elastic group's: a
    leaver may hand a chunk back after the others found the queue empty; the group stops when
    no member has a batch)."""

    def __init__(self, rank: int, queue, ds, cfg, batch_size: Callable[[], int],
                 leaving: Callable[[], bool], keep_asking: bool = False):
        self.rank, self.queue, self.ds, self.cfg = rank, queue, ds, cfg
        self.batch_size, self.leaving, self.keep_asking = batch_size, leaving, keep_asking
        self.taken: list = []  # (epoch, chunk) in the order they were trained on
        self.position: dict[int, int] = {}  # slot -> rows of its leased chunk handed out
        self.left_early = False  # it stopped taking chunks with some still to train

    def batches(self, slots: tuple[int, ...]):
        """(batch, finished): ``finished`` is (chunk, slot) on the last batch of a chunk, for
        the caller to report done once that batch's step is done. Successive chunks take
        turns in ``slots``: with two, a caller may look a batch ahead into the next chunk
        while the last step of the current one is under way. A batch is read when it is asked
        for, at the batch size of that moment."""
        seed = self.cfg.train.seed if self.cfg.data.shuffle else None
        for k in itertools.count():
            slot = slots[k % len(slots)]
            if self.leaving():
                self.left_early = True
                return
            taken = ray.get(self.queue.take_with_skip.remote(self.rank, slot))
            if taken is None and self.keep_asking:
                yield None, None
                continue
            if taken is None:
                return
            item, skip = taken  # skip: rows trained before (a restore, a hand over)
            epoch, chunk = item
            self.taken.append(item)
            self.position[slot] = skip
            if skip >= chunk.rows:
                self.done(item, slot)
                continue
            for batch in self.ds.batches(chunk, self.batch_size, shuffle_seed=seed,
                                         epoch=epoch, start=skip):
                self.position[slot] += len(batch)
                yield batch, ((item, slot) if self.position[slot] >= chunk.rows else None)

    def done(self, item, slot: int) -> None:
        ray.get(self.queue.done.remote(self.rank, item, slot))
