"""Simulated PS shards: the real ``ShardCore`` (ps/core.py) with its mode's ``ShardRule``,
behind an object shaped like a shard's Ray handle (``shard.pull.remote(...)``,
``shard.push.remote(...)``) whose calls travel and wait on the simulated clock.

A call is a message (``Timing.message_s`` of its arrays' bytes) to the shard (one caller's
calls arrive in the order they were sent), which serves one call at a time in the order they
arrive (``Timing.pull_service_s``, ``push_service_s``: a fixed cost per call, the handling of
it in the shard's process, and a cost per row; with ``Timing.shard_background``, also the
process's CPU by the second since its previous call); the core's own method runs when the
service ends, so a pull reads the rows as every push served before it left them, and the answer
travels back. A sync pull that asks for ``min_version`` waits at the shard until the core has
applied that many updates, as the real shard does (ps/shard.py).
"""

from __future__ import annotations

from types import SimpleNamespace

from recsync.ps.core import ShardCore
from recsync.ps.shard import nbytes
from recsync.simulation.clock import Clock, Future
from recsync.simulation.timing import Timing


class SimShard:
    """One shard on the simulated clock."""

    def __init__(self, clock: Clock, core: ShardCore, timing: Timing):
        self.clock, self.core, self.timing = clock, core, timing
        self.free_at = 0.0  # when the shard finishes what it has been given
        self.busy_s = 0.0  # simulated time spent serving calls
        self.calls = 0
        self._last_call: float | None = None  # when the previous call came (shard_background)
        self._parked: list[tuple[int, object]] = []  # (min_version, start) of waiting pulls
        self._channel_free: dict = {}  # caller -> when its last call arrives here
        self.pull = SimpleNamespace(remote=self._pull)
        self.push = SimpleNamespace(remote=self._push)
        self.call = SimpleNamespace(remote=self._rule_call)

    def _pull(self, ids, min_version: int = 0, read_only: bool = False,
              dense: str = "vector") -> Future:
        rows = sum(len(i) for i in ids)

        def serve():
            return self.core.pull(ids, read_only, dense)

        return self._call(ids, self.timing.pull_service_s(rows), serve, min_version)

    def _push(self, ids, grads, dense_grad, meta: dict) -> Future:
        rows = sum(len(i) for i in ids)

        def serve():
            result = self.core.push(ids, grads, dense_grad, meta)
            self._unpark()
            return result

        return self._call((ids, grads, dense_grad), self.timing.push_service_s(rows), serve)

    def _rule_call(self, verb: str, *args) -> Future:
        """A verb of the mode's rule (EASGD's ``exchange``), served in a push's fixed time
        per call (its arithmetic on the dense vector is not modelled)."""
        method = getattr(self.core.rule, verb, None)
        if verb.startswith("_") or not callable(method):
            raise ValueError(f"the rule of mode {self.core.mode!r} has no verb {verb!r}")
        return self._call(args, self.timing.push_call_s, lambda: method(self.core, *args))

    def _call(self, payload, service_s: float, serve, min_version: int = 0) -> Future:
        future = Future(self.clock)
        # one caller's calls to one shard arrive in the order they were sent (as Ray runs one
        # caller's calls to an actor in order): a small pull never overtakes a push before it
        caller = self.clock.current
        arrive = max(self.clock.now + self.timing.message_s(nbytes(payload)),
                     self._channel_free.get(caller, 0.0))
        self._channel_free[caller] = arrive

        def start():
            begin = max(self.clock.now, self.free_at)
            served = service_s + self._background_s()
            self.free_at = begin + served
            self.busy_s += served
            self.calls += 1
            self.clock.at(self.free_at, finish)

        def finish():
            answer = serve()
            back = self.timing.message_s(nbytes(answer))
            self.clock.at(self.clock.now + back, lambda: future.resolve(answer))

        def arrived():
            if self.core.version >= min_version:
                start()
            else:
                self._parked.append((min_version, start))

        self.clock.at(arrive, arrived)
        return future

    def _background_s(self) -> float:
        """The shard's CPU by the second since its previous call, charged to this one."""
        now, last = self.clock.now, self._last_call
        self._last_call = now
        return 0.0 if last is None else self.timing.shard_background * max(0.0, now - last)

    def _unpark(self) -> None:
        """Pulls waiting for a version the core has now reached are served."""
        ready = [s for v, s in self._parked if self.core.version >= v]
        self._parked = [(v, s) for v, s in self._parked if self.core.version < v]
        for start in ready:
            start()


class InstantShard:
    """A shard's core behind the same handle shape, answering at once and costing no simulated
    time: what an evaluation reads (the real runtime's evaluations run beside training)."""

    def __init__(self, clock: Clock, core: ShardCore):
        self.clock, self.core = clock, core
        self.pull = SimpleNamespace(remote=self._pull)

    def _pull(self, ids, min_version: int = 0, read_only: bool = False,
              dense: str = "vector") -> Future:
        future = Future(self.clock)
        future.resolve(self.core.pull(ids, read_only, dense))
        return future
