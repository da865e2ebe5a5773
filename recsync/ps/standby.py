"""Warm standby PS shards (``recovery.standby_shards``, docs/recovery.md).

Ray restarting a dead shard takes seconds (a new process imports torch and recsync, then builds
the shard), and every worker waits for it. A standby is a ``PSShard`` process started with the
run and kept idle, its imports done. ``ShardDirectory`` (an actor) knows which process serves
each shard: a client whose call to a shard failed asks it for the shard's process
(``current``); if that process is dead, a standby takes the shard over (``PSShard.take_over``:
the shard's core, its last checkpoint chain) and is from then on that shard's process for every
client; a new standby starts in the background. Only the load is waited for.

Several clients that see the same death wait for the same take-over. A standby that died
while idle is passed over (the next one, or a new one, takes over).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque

import ray

from recsync.checkpoint import job
from recsync.cluster.placement import Placement, on_driver_node, place
from recsync.ps.build import make_core
from recsync.ps.shard import PSShard

MAX_SHARD_RESTARTS = 20  # per shard, with full or partial recovery (Ray's or take-overs)
PING_S = 2.0  # a shard that does not answer in this long is busy, not dead
TAKE_OVER_TRIES = 3  # standbys tried in turn (each one may itself have died)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class ShardDirectory:
    def __init__(self, shards: list, builders: list, checkpoint_dirs: list[str],
                 standby_args: tuple, standbys: int, max_take_overs: int,
                 placement: Placement | None = None):
        """``shards``: the shards' processes (actor handles); ``builders``: ObjectRefs of each
        shard's core builder (ps/build.py); ``checkpoint_dirs``: each shard's checkpoints;
        ``standby_args``: (network, keep, cores) of ``PSShard``; ``standbys``: how many to
        keep ready; ``max_take_overs``: per shard, after which a death is not taken over;
        ``placement``: where a standby goes (cluster/placement.py)."""
        self.placement = placement or Placement("none")
        self.shards = list(shards)
        self.builders, self.dirs = builders, checkpoint_dirs
        self.standby_args, self.max_take_overs = standby_args, max_take_overs
        self.generation = [0] * len(shards)
        self.standbys: deque = deque(self._new_standby() for _ in range(standbys))
        self.target = standbys
        self.pending: dict[int, asyncio.Future] = {}
        self.take_overs: list[dict] = []

    def _new_standby(self):
        """A standby that has built (and dropped) shard 0's core: the one with the most to
        import (the dense parameters' optimizer, where the mode keeps them on the PS)."""
        network, keep, cores = self.standby_args
        return PSShard.options(max_restarts=0, **self.placement.standby()).remote(
            None, network, None, keep, cores, self.builders[0])

    async def current(self, shard: int):
        """Shard ``shard``'s live process: the one known, or, if it has died, the standby
        that took it over (waits for the take-over)."""
        if shard in self.pending:
            await asyncio.shield(self.pending[shard])
            return self.shards[shard]
        generation = self.generation[shard]
        try:
            await asyncio.wait_for(self.shards[shard].incarnation.remote(), PING_S)
            return self.shards[shard]
        except asyncio.TimeoutError:
            return self.shards[shard]  # alive, busy
        except ray.exceptions.RayActorError:
            pass
        if self.generation[shard] != generation:  # taken over while we looked
            return self.shards[shard]
        if shard not in self.pending:
            self.pending[shard] = asyncio.ensure_future(self._take_over(shard))
        await asyncio.shield(self.pending[shard])
        return self.shards[shard]

    async def _take_over(self, shard: int) -> None:
        try:
            if self.generation[shard] >= self.max_take_overs:
                raise RuntimeError(f"PS shard {shard} died {self.max_take_overs + 1} times; no "
                                   f"more take-overs")
            begin = time.time()
            errors = []
            for _ in range(TAKE_OVER_TRIES):
                standby = self.standbys.popleft() if self.standbys else self._new_standby()
                while len(self.standbys) < self.target:  # a new one, in the background
                    self.standbys.append(self._new_standby())
                try:
                    loaded = await standby.take_over.remote(self.builders[shard],
                                                            self.dirs[shard])
                except ray.exceptions.RayActorError as e:  # the standby itself died
                    errors.append(str(e).splitlines()[0])
                    continue
                self.shards[shard] = standby
                self.generation[shard] += 1
                self.take_overs.append({"shard": shard, "asked_unix": begin,
                                        "generation": self.generation[shard],
                                        "ready_unix": time.time(), "pid": loaded["pid"],
                                        "take_over_s": loaded["take_over_s"],
                                        "passed_over": errors})
                return
            raise RuntimeError(f"PS shard {shard}: no standby could take over ({errors})")
        finally:
            self.pending.pop(shard, None)

    async def handles(self) -> list:
        """Every shard's process now."""
        return list(self.shards)

    async def standby_handles(self) -> list:
        """The standbys waiting (fault injection kills one in tests)."""
        return list(self.standbys)

    async def report(self) -> list[dict]:
        """The take-overs so far."""
        return list(self.take_overs)


def start_shards(cfg, tables, dense_init, checkpoint_dir) -> tuple[list, list, object,
                                                                   Placement]:
    """The run's PS shard processes: (their handles, their core builders as ObjectRefs, the
    ``ShardDirectory`` if the run keeps standbys, else None, the run's placement). Without
    standbys but with recovery on, Ray restarts a dead shard's process (which reloads its own
    checkpoint)."""
    c, r = cfg.cluster, cfg.recovery
    net = cfg.network
    network = (net.latency_ms / 1e3, net.ms_per_mb / 1e3 / 2**20) if net.enabled else None
    # held here: Ray needs them again to restart a shard (a standby to take one over), and
    # drops a large one (shard 0's dense parameters) once nothing refers to it
    builders = [ray.put(functools.partial(make_core, tables, cfg, s,
                                          dense_init if s == 0 else None))
                for s in range(c.ps_shards)]
    dirs = [None if checkpoint_dir is None else str(job.shard_dir(checkpoint_dir, s))
            for s in range(c.ps_shards)]
    standbys = r.standbys if checkpoint_dir is not None else 0
    restarts = MAX_SHARD_RESTARTS if r.kind != "none" and not standbys else 0
    cores = cfg.emulation.cores_per_shard
    placement = place(cfg, standbys)
    shards = [PSShard.options(max_restarts=restarts, **placement.shard(s)).remote(
        builders[s], network, dirs[s], r.keep, cores) for s in range(c.ps_shards)]
    directory = None
    if standbys:  # on the driver's node: it must outlive any other
        directory = ShardDirectory.options(**on_driver_node()).remote(
            shards, builders, dirs, (network, r.keep, cores), standbys, MAX_SHARD_RESTARTS,
            placement)
    return shards, builders, directory, placement
