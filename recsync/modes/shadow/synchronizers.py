"""The synchronizers of modes shadow and foreground (ShadowSync, docs/design.md §6.4), one round
each: ``ElasticSync`` (EASGD; the center copy lives on PS shard 0, in the shard rule
``CenterCopy``, which computes the move), ``AveragingSync`` (MA, and BMUF with its block momentum)
over a process group of their own. ``round(done)`` carries whether this trainer has finished
training; the all-reduce adds the flags up, so every trainer learns in the same round that all
are done and stops after it: no collective is ever left waiting for a trainer that has stopped.
"""

from __future__ import annotations

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
                 survive_shard_restarts: bool = False):
        """``shards``: the worker's list of shard processes (read at every round: a standby
        that took shard 0 over replaces it there); ``survive_shard_restarts`` (partial
        recovery): a round whose shard died is skipped (the shard comes back with its center
        from its last checkpoint)."""
        self.replica, self.shards, self.alpha = replica, shards, alpha
        self.survive_shard_restarts = survive_shard_restarts
        self.skipped = 0

    def round(self, done: bool) -> bool:
        try:
            d = ray.get(self.shards[0].call.remote("exchange", self.replica.vector().numpy(),
                                                   self.alpha))
        except ray.exceptions.RayActorError:
            if not self.survive_shard_restarts:
                raise
            self.skipped += 1
            return done
        self.replica.add_(-as_tensor(d))
        return done


class AveragingSync:
    """MA (``bmuf`` None) or BMUF: all-reduce the replicas and a done flag on ``group``."""

    def __init__(self, replica: DenseReplica, group, trainers: int, bmuf: BMUF | None = None):
        self.replica, self.group, self.trainers, self.bmuf = replica, group, trainers, bmuf

    def round(self, done: bool) -> bool:
        import torch.distributed as dist
        snapshot = self.replica.vector()
        buf = torch.cat([snapshot, torch.tensor([float(done)])])
        dist.all_reduce(buf, group=self.group)
        mean = mean_of(buf[:-1], self.trainers)
        target = mean if self.bmuf is None else self.bmuf.update(mean)
        self.replica.add_(target - snapshot)  # keeps the Hogwild updates made meanwhile
        return int(buf[-1].item()) == self.trainers


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
