"""A chunk of the training data: the unit of work the work queue hands out (worker/queue.py).
Apart from the reader (data/reader.py), so that the queue's actor does not import torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """Rows [start, stop) of one part of one split."""

    split: str
    part: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start
