"""The work queue: chunks of training data handed to whichever worker asks next.

Fast workers take more chunks. A chunk is leased to one worker until it reports it done; if the
worker dies, ``release`` puts its leased chunks back at the front, so every chunk of every epoch
is completed exactly once (the rows of a chunk a worker had started may be trained on again).
A worker whose threads train in parallel (Hogwild) holds one lease per thread (``slot``).

``state`` and ``restore`` are the data position in a job checkpoint: what is pending, leased
and completed. A restored lease goes back to the front of the queue with the number of its
rows already trained (``skip``), which the next worker to take it skips; so does a lease that a
worker of an elastic sync run hands over as it leaves (``hand_over``). Positions are in rows,
not batches: the workers of an elastic sync run change their batch size as the group does.
"""

from __future__ import annotations

from collections import Counter, deque

import ray

from recsync.data.chunk import Chunk
from recsync.run.signals import ignore_interrupts

Item = tuple[int, Chunk]  # (epoch, chunk)


def encode_item(item: Item) -> list:
    """An item as plain JSON: [epoch, split, part, start, stop]."""
    epoch, c = item
    return [epoch, c.split, c.part, c.start, c.stop]


def decode_item(row: list) -> Item:
    epoch, split, part, start, stop = row
    return int(epoch), Chunk(str(split), int(part), int(start), int(stop))


class ChunkQueue:
    def __init__(self, items: list[Item]):
        self.pending: deque[Item] = deque(items)
        self.leased: dict[tuple[int, int], Item] = {}  # (worker, slot) -> item
        self.completed: Counter = Counter()       # item -> times completed (must end at 1)
        self.by_worker: dict[int, dict] = {}
        self.skip: dict[Item, int] = {}  # item -> rows already trained (after a restore)
        self.num_items = len(set(items))  # the run's (epoch, chunk) items, each done once
        self.dropped: set = set()  # items ``drain`` took away (early stopping), each once
        self.released = self.released_rows = 0  # leases given back (``release``): what their
        # worker had trained of them is trained again, at most these rows

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
        self.released += len(items)
        self.released_rows += sum(c.rows for _, c in items)
        return items

    def hand_over(self, worker: int, rows: dict[int, int]) -> list[Item]:
        """A paused worker leaves (an elastic sync run): its leased items go back to the front
        of the queue with the rows of each it trained (``rows``: by slot), which the next worker
        to take one skips. Nothing is trained twice, so nothing counts as released."""
        keys = [k for k in self.leased if k[0] == worker]
        items = [self.leased.pop(k) for k in keys]
        for (_, slot), item in zip(keys, items):
            if rows.get(slot):
                self.skip[item] = rows[slot]
        self.pending.extendleft(reversed(items))
        return items

    def drain(self) -> int:
        """The run stops early (train.patience): no item is handed out any more (the leased
        ones are finished; after a recovery restored the queue, its leases are pending again
        and go too). Returns how many pending items went."""
        n = len(self.pending)
        self.dropped.update(self.pending)  # a set: an item drained again after a restore
        self.pending.clear()  # counts once
        self.skip.clear()
        return n

    def take_with_skip(self, worker: int, slot: int = 0) -> tuple[Item, int] | None:
        """``take``, and how many of the item's rows were trained before (a restore, a hand
        over)."""
        item = self.take(worker, slot)
        return None if item is None else (item, self.skip.pop(item, 0))

    def state(self, positions: dict[tuple[int, int], int] | None = None) -> dict:
        """The data position as plain JSON. ``positions``: rows trained of each leased item,
        by (worker, slot) (known when the workers are paused; else 0: a leased chunk is trained
        again from its start). Leases are [item, rows trained, [worker, slot]];
        ``pending_skip`` is [item, rows trained] of each pending item taken up part way before
        (handed over, or restored and not taken since)."""
        positions = positions or {}
        leased = [[encode_item(item), positions.get(key, 0), list(key)]
                  for key, item in sorted(self.leased.items())]
        return {"pending": [encode_item(i) for i in self.pending], "leased": leased,
                "completed": [[encode_item(i), n] for i, n in self.completed.items()],
                "by_worker": {str(w): dict(s) for w, s in self.by_worker.items()},
                "position_unit": "rows",
                "pending_skip": [[encode_item(i), n] for i, n in self.skip.items()]}

    def restore(self, state: dict) -> None:
        """Go back to ``state`` (``in_rows``): its leases become the front of the queue, with
        their skips."""
        leased = [(decode_item(row), int(skip)) for row, skip, *_ in state["leased"]]
        self.pending = deque([i for i, _ in leased] + [decode_item(r) for r in state["pending"]])
        self.skip = {decode_item(row): int(n) for row, n in state.get("pending_skip", [])}
        self.skip.update({i: s for i, s in leased if s})
        self.leased = {}
        self.completed = Counter({decode_item(r): int(n) for r, n in state["completed"]})
        self.by_worker = {int(w): dict(s) for w, s in state["by_worker"].items()}

    def summary(self) -> dict:
        """Counts of the data position. ``completed_more_than_once``: items completed twice or
        more; ``completed_never``: items not completed (yet): both 0 at the end of a run (but
        for the ``dropped`` ones of a run that stopped early: ``drain``).
        ``released`` (``released_rows``): leases given back by workers that died or were
        stopped with them (a group rebuilt), over the run (a restore does not undo them)."""
        counts = Counter(self.completed.values())
        return {"pending": len(self.pending), "leased": len(self.leased),
                "completed": sum(self.completed.values()), "chunks": self.num_items,
                "completed_more_than_once": sum(n for c, n in counts.items() if c > 1),
                "completed_never": self.num_items - sum(1 for n in self.completed.values()
                                                        if n > 0),
                "released": self.released, "released_rows": self.released_rows,
                "dropped": sum(1 for i in self.dropped if not self.completed.get(i)),
                "by_worker": {str(w): s for w, s in sorted(self.by_worker.items())}}


def in_rows(state: dict, batch_size: int) -> dict:
    """A data position with its leases' positions in rows: a job checkpoint written before
    positions were rows counted batches of ``train.batch_size`` (the run's, then every
    worker's)."""
    unit = state.get("position_unit", "batches")
    if unit == "rows":
        return state
    if unit != "batches":
        raise ValueError(f"the data position's positions are in {unit!r}, not rows")
    leased = [[item, int(n) * batch_size, *rest] for item, n, *rest in state["leased"]]
    return {**state, "leased": leased, "position_unit": "rows"}


@ray.remote(num_cpus=0, max_restarts=0)
class WorkQueue:
    """The Ray actor around ChunkQueue."""

    def __init__(self, items: list[Item]):
        ignore_interrupts()
        self.q = ChunkQueue(items)

    def take_with_skip(self, worker: int, slot: int = 0) -> tuple[Item, int] | None:
        return self.q.take_with_skip(worker, slot)

    def state(self, positions: dict | None = None) -> dict:
        return self.q.state(positions)

    def restore(self, state: dict) -> None:
        self.q.restore(state)

    def done(self, worker: int, item: Item, slot: int = 0) -> None:
        self.q.done(worker, item, slot)

    def release(self, worker: int) -> list[Item]:
        return self.q.release(worker)

    def hand_over(self, worker: int, rows: dict[int, int]) -> list[Item]:
        return self.q.hand_over(worker, rows)

    def drain(self) -> int:
        return self.q.drain()

    def summary(self) -> dict:
        return self.q.summary()
