"""The synchronizers of modes shadow and foreground (ShadowSync, docs/design.md §6.4), one round
each: ``ElasticSync`` (EASGD; the center copy lives on PS shard 0, in the shard rule
``CenterCopy``, which computes the move), ``AveragingSync`` (MA, and BMUF with its block momentum)
over a process group of their own. ``round(done)`` carries whether this trainer has finished
training; the all-reduce adds the flags up, so every trainer learns in the same round that all
are done and stops after it: no collective is ever left waiting for a trainer that has stopped.
"""

from __future__ import annotations

import threading

import numpy as np
import ray
import torch

from recsync.modes.async_ps import ApplyNow
from recsync.modes.shadow.replica import DenseReplica
from recsync.modes.shadow.rules import BMUF, easgd_delta, mean_of
from recsync.ps.aggregation import as_tensor


class ElasticSync:
    """EASGD against the center c on PS shard 0: d = alpha (w - c), c += d there, w -= d here.
    One call a round (the shard computes d from the replica sent: pulling c and pushing d would
    move the vector three times). Needs no agreement between trainers: each stops when done."""

    def __init__(self, replica: DenseReplica, shards: list, alpha: float,
                 survive_shard_restarts: bool = False, get=None):
        """``shards``: the worker's list of shard processes (read at every round: a standby
        that took shard 0 over replaces it there); ``survive_shard_restarts`` (partial
        recovery): a round whose shard died is skipped (the shard comes back with its center
        from its last checkpoint); ``get``: waits for a call's answer (None: ray.get; the
        simulator's shards answer on its clock)."""
        self.replica, self.shards, self.alpha = replica, shards, alpha
        self.survive_shard_restarts, self.get = survive_shard_restarts, get
        self.skipped = 0

    def round(self, done: bool) -> bool:
        try:
            d = (self.get or ray.get)(self.shards[0].call.remote(
                "exchange", self.replica.vector().numpy(), self.alpha))
        except ray.exceptions.RayActorError:
            if not self.survive_shard_restarts:
                raise
            self.skipped += 1
            return done
        self.replica.add_(-as_tensor(d))
        return done


class AveragingSync:
    """MA (``bmuf`` None) or BMUF: all-reduce the replicas, a done flag and a pause flag on
    ``group`` (of ``trainers``).

    An elastic run forms the group again when trainers join or leave
    (distributed/regroup_rounds.py): the driver asks for a pause (``request_pause``), the flag
    rides in the next round's all-reduce, and every trainer stops taking part in rounds after
    that same round (``paused_after``; not where that round found every trainer done: their
    rounds end there) while its training goes on. Then each is released into a new group
    (``regroup``) or told that it left (``leave``: its rounds end).

    ``all_reduce(tensor)``: sums in place over the group (None: torch.distributed's on
    ``group``; the simulator gives its own)."""

    def __init__(self, replica: DenseReplica, group, trainers: int, bmuf: BMUF | None = None,
                 all_reduce=None):
        self.replica, self.group, self.trainers, self.bmuf = replica, group, trainers, bmuf
        self._all_reduce = all_reduce
        self.rounds = 0  # rounds of the group now
        self.paused_after: int | None = None  # the round after which every trainer paused
        self._asked = False
        self._left = False
        self._cond = threading.Condition()

    def ready(self, wait: bool = True) -> bool:
        """Whether a round can run now (False: paused); ``wait``: until it can (released,
        or left: its round then ends the rounds)."""
        with self._cond:
            if wait:
                self._cond.wait_for(lambda: self.paused_after is None or self._left)
            return self.paused_after is None or self._left

    def round(self, done: bool) -> bool:
        self.ready()
        with self._cond:
            if self._left:
                return True  # no more rounds for this trainer: it left the group
            asked = self._asked
        snapshot = self.replica.vector()
        buf = torch.cat([snapshot, torch.tensor([float(done), float(asked)])])
        if self._all_reduce is not None:
            self._all_reduce(buf)
        else:
            import torch.distributed as dist
            dist.all_reduce(buf, group=self.group)
        mean = mean_of(buf[:-2], self.trainers)
        target = mean if self.bmuf is None else self.bmuf.update(mean)
        self.replica.add_(target - snapshot)  # keeps the Hogwild updates made meanwhile
        all_done = int(buf[-2].item()) == self.trainers
        with self._cond:
            self.rounds += 1
            if buf[-1].item() > 0 and not all_done:  # someone was asked: all pause now
                self.paused_after, self._asked = self.rounds, False
        return all_done

    def request_pause(self) -> None:
        """Pause after the next round (the flag goes into its all-reduce)."""
        with self._cond:
            if self.paused_after is None:
                self._asked = True

    def regroup(self, group, trainers: int) -> None:
        """Go on, in ``group`` of ``trainers`` (this process joined it since the pause), or,
        ``group`` None, in the same one (nobody joined or left)."""
        with self._cond:
            if group is not None:
                self.group, self.trainers, self.rounds = group, trainers, 0
            self.paused_after, self._asked = None, False
            self._cond.notify_all()

    def leave(self) -> None:
        """This trainer left the group: no more rounds (one waiting returns at once)."""
        with self._cond:
            self._left = True
            self._cond.notify_all()

    def bmuf_state(self) -> dict | None:
        """BMUF's global model and block momentum (the same on every trainer), for a trainer
        that joins (read while the rounds are paused); None under MA."""
        if self.bmuf is None:
            return None
        return {"global_model": self.bmuf.global_model.numpy().copy(),
                "delta": self.bmuf.delta.numpy().copy()}


class CenterCopy(ApplyNow):
    """Shard 0's rule under EASGD: rows are trained as in async, and the shard holds the center
    copy c of the dense parameters, which each trainer's elastic move d pulls towards it."""

    def __init__(self, center: np.ndarray):
        # a copy: ``center`` may be a read-only array from Ray's object store
        self.center = torch.from_numpy(np.array(center, dtype=np.float32))
        self.pushes = 0

    def exchange(self, core, replica: np.ndarray, alpha: float) -> np.ndarray:
        """One EASGD round in one call: d = alpha (w - c) from a trainer's replica w; the
        center moves by +d here, and the trainer moves by -d with the d returned."""
        if replica.shape != tuple(self.center.shape):
            raise ValueError(f"EASGD replica of shape {replica.shape}, the center has "
                             f"{tuple(self.center.shape)}")
        d = easgd_delta(as_tensor(replica), self.center, alpha)
        self.center.add_(d)
        self.pushes += 1
        return d.numpy()

    def model_dense(self, core) -> np.ndarray:
        """EASGD's model is its center copy."""
        return self.center.numpy().copy()

    def snapshot(self):
        return {"center": self.center.numpy().copy()}, {"pushes": self.pushes}

    def restore(self, arrays, meta) -> None:
        self.center = as_tensor(arrays["center"]).clone()
        self.pushes = meta["pushes"]

    def stats(self) -> dict:
        return {"easgd_pushes": self.pushes}
