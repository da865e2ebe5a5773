"""Which rows a partial checkpoint saves (CPR): the most used ones (MFU) or the ones a
sub-sample of the training samples touched (SSU).

Both watch the rows each push touches on one shard (as local indices) and, at a partial save,
``select`` the rows to save and forget them; after a full save ``reset`` forgets everything.
A shard's checkpoint splits ``select`` in two: ``freeze`` (at once: what was watched so far,
and a function that chooses from it, run on the copy's thread) and ``restart`` (the chosen
rows are forgotten, once chosen).

- MFU keeps a counter per row of the shard (4 bytes a row): each push that touches a row adds
  one. A partial save takes the ``fraction`` of the counted rows with the highest counts, ties
  broken by index, and takes from their counters what they had counted when the save began
  (uses while the rows were copied count towards the next save); the others keep counting,
  so a row used steadily but not among the top is saved once its count grows (or at the next
  full save).
- SSU records the rows touched by the samples the workers sampled (``ssu_rate``; the PS client
  marks them in each push), at most ``max_rows`` per shard between saves; rows beyond that are
  not recorded (counted in ``dropped``) and wait for the next full save. Memory: the recorded
  rows only.

A dynamic table's rows are its slots (embedding/dynamic_table.py): the shard records the slots
of the ids pushed, and a slot freed by an eviction or an expiry is forgotten (``forget``), so
the id that gets it next starts from nothing rather than from the evicted id's usage.
"""

from __future__ import annotations

import math

import torch


class MostUsed:
    name = "mfu"

    def __init__(self, table_rows: list[int], fraction: float):
        if not 0 < fraction <= 1:
            raise ValueError(f"the MFU fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction
        self.counts = [torch.zeros(n, dtype=torch.int32) for n in table_rows]
        self.frozen: list[torch.Tensor] | None = None  # the counts a pending choice is made of
        self.forgotten: list[list[torch.Tensor]] | None = None  # rows forgotten since then

    def record(self, table: int, local: torch.Tensor, sampled: torch.Tensor | None) -> None:
        """``local``: unique row indices a push touched (``sampled`` is for SSU)."""
        self.counts[table].index_add_(0, local, torch.ones(len(local), dtype=torch.int32))

    def select(self) -> list[torch.Tensor]:
        """Per table, the rows to save now (sorted); their counters restart from 0."""
        rows = self.freeze()()
        self.restart(rows)
        return rows

    def freeze(self):
        """A function returning, on any thread, what ``select`` would return now (the counts
        are copied; a copy is cheap, choosing is not)."""
        counts = self.frozen = [c.clone() for c in self.counts]
        self.forgotten = [[] for _ in counts]
        return lambda: [_most_used(c, self.fraction) for c in counts]

    def restart(self, rows: list[torch.Tensor]) -> None:
        """The counters of the rows chosen restart from what they counted since ``freeze``
        (the uses of a row pushed while its copy was taken count towards the next save; a
        row forgotten meanwhile counts from then)."""
        if self.frozen is None:
            self.frozen = [torch.zeros_like(c) for c in self.counts]
            self.forgotten = [[] for _ in self.counts]
        for counts, before, forgotten, chosen in zip(self.counts, self.frozen, self.forgotten,
                                                     rows):
            since = counts[chosen] - before[chosen]
            if forgotten:
                fresh = torch.isin(chosen, torch.cat(forgotten))
                since[fresh] = counts[chosen][fresh]
            counts[chosen] = since.clamp_(min=0)
        self.frozen = self.forgotten = None

    def forget(self, table: int, local: torch.Tensor) -> None:
        """Rows ``local`` of ``table`` start again from 0 (a dynamic table's freed slots)."""
        self.counts[table][local] = 0
        if self.forgotten is not None:  # a choice is pending: restart must know
            self.forgotten[table].append(local.clone())

    def reset(self) -> None:
        for c in self.counts:
            c.zero_()
        self.frozen = self.forgotten = None

    def stats(self) -> dict:
        return {"rows_counted": int(sum(int((c > 0).sum()) for c in self.counts))}


def _most_used(counts: torch.Tensor, fraction: float) -> torch.Tensor:
    """The ``fraction`` of the counted rows with the highest counts (sorted), ties broken by
    index (lower first), as a stable sort by count would: every row above the k-th largest
    count, then the first rows at it (a threshold from topk: 2-3x faster than sorting)."""
    used = counts.nonzero().squeeze(1)
    k = math.ceil(fraction * len(used))
    if k == 0:
        return used
    values = counts.index_select(0, used)
    kth = torch.topk(values, k, sorted=False).values.min()
    above = used[values > kth]
    return torch.cat([above, used[values == kth][:k - len(above)]]).sort().values


class SampledRows:
    name = "ssu"

    def __init__(self, num_tables: int, max_rows: int):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.rows: list[set[int]] = [set() for _ in range(num_tables)]
        self.recorded = 0
        self.dropped = 0  # rows not recorded for want of room (since the start)

    def record(self, table: int, local: torch.Tensor, sampled: torch.Tensor | None) -> None:
        """Record the rows of ``local`` that ``sampled`` (bool, aligned) marks."""
        if sampled is None or not len(local):
            return
        seen = self.rows[table]
        fresh = [i for i in local[sampled].tolist() if i not in seen]
        room = self.max_rows - self.recorded
        if len(fresh) > room:
            self.dropped += len(fresh) - room
            fresh = fresh[:room]
        seen.update(fresh)
        self.recorded += len(fresh)

    def select(self) -> list[torch.Tensor]:
        return self.freeze()()

    def freeze(self):
        """A function returning, on any thread, the rows recorded so far (sorted); recording
        starts again at once."""
        rows = self.rows
        self.rows = [set() for _ in rows]
        self.recorded = 0
        return lambda: [torch.tensor(sorted(r), dtype=torch.int64) for r in rows]

    def restart(self, rows: list[torch.Tensor]) -> None:
        """Nothing: ``freeze`` already started recording again."""

    def forget(self, table: int, local: torch.Tensor) -> None:
        """Rows ``local`` of ``table`` are no longer recorded (a dynamic table's freed slots)."""
        rows = self.rows[table]
        before = len(rows)
        rows.difference_update(local.tolist())
        self.recorded -= before - len(rows)

    def reset(self) -> None:
        for rows in self.rows:
            rows.clear()
        self.recorded = 0

    def stats(self) -> dict:
        return {"rows_recorded": self.recorded, "rows_dropped": self.dropped}
