"""A worker's view of the simulated cluster: the real ``PSClient`` (ps/client.py), whose waits
for Ray's answers become waits on the simulated clock, and the all-reduce of sync-like modes.

Everything else of the client is the real one: the deduplication, the routing of ids to
shards, the merge of the answers, the gradients' gather, the push window.
"""

from __future__ import annotations

import torch

from recsync.ps.client import PendingPull, PSClient
from recsync.simulation.clock import Clock, Future
from recsync.simulation.timing import Timing


class SimClient(PSClient):
    """PSClient over simulated shards (simulation/shards.py): their calls return Futures, which
    this client waits for on ``clock``."""

    def __init__(self, clock: Clock, shards: list, plan, **kwargs):
        super().__init__(shards, plan, **kwargs)
        self.clock = clock

    def _now(self) -> float:
        return self.clock.now

    def _answers(self, pending: PendingPull) -> list:
        return [self.clock.wait(f) for f in pending.refs]

    def _wait_push(self, ref: Future):
        return self.clock.wait(ref)

    def _arrived_version(self, ref: Future) -> int:
        return ref.value[2] if ref.done and ref.error is None else -1


class SimGroup:
    """The workers' process group on the simulated clock: ``all_reduce(tensor)`` sums a tensor
    over all ``size`` members in place, each member's call returning once every member's
    contribution arrived and the ring all-reduce's time (``Timing.all_reduce_s``) has passed.
    """

    def __init__(self, clock: Clock, size: int, timing: Timing):
        self.clock, self.size, self.timing = clock, size, timing
        self._parts: list[torch.Tensor] = []
        self._round: Future | None = None
        self.rounds = 0
        self.waited_s = 0.0  # simulated time members spent waiting for the last to arrive

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self._round is None:
            self._round, self._arrivals = Future(self.clock), []
        round_, arrived = self._round, self.clock.now
        self._parts.append(tensor)
        self._arrivals.append(arrived)
        if len(self._parts) == self.size:
            total = torch.stack(self._parts).sum(dim=0)
            parts, arrivals = self._parts, self._arrivals
            self._parts, self._round = [], None
            self.rounds += 1
            self.waited_s += sum(self.clock.now - a for a in arrivals)
            done = self.clock.now + self.timing.all_reduce_s(
                tensor.numel() * tensor.element_size(), self.size)
            self.clock.at(done, lambda: round_.resolve((parts, total)))
        parts, total = self.clock.wait(round_)
        tensor.copy_(total)
