"""Start worker processes (and form their group), and start again one whose node died before
it ran.

When a node dies, Ray moves its placement-group bundles to other nodes only once the cluster
has marked the node dead (seconds of missed heartbeats). A worker restarted in that gap is
scheduled onto the dead node and dies unstarted ("its node has died"): it is made again after a
pause, a few times. A worker whose constructor raised is not: that error would recur.
"""

from __future__ import annotations

import time

import ray

from recsync.modes.base import JOIN_REGROUP
from recsync.worker.worker import Worker

TRIES = 10
PAUSE_S = 2.0  # Ray's default health check marks a node dead after about 15 s
START_TIMEOUT_S = 600  # a worker not built by then waits for resources it will not get


def spawn_workers(actors, ranks: list[int], dense_state: dict | None, step_index: int) -> None:
    """``actors.workers[r]`` (actors.RunActors) for each of ``ranks``: a new Worker process,
    built (waited for)."""
    for r in ranks:
        actors.workers[r] = new_worker(actors, r, dense_state, step_index)
    for attempt in range(TRIES):
        lost = []
        for r in ranks:
            try:
                ray.get(actors.workers[r].where.remote(), timeout=START_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(
                    f"worker {r} did not start in {START_TIMEOUT_S} s: Ray could not place it "
                    f"(cluster.worker_cpus = {actors.cfg.cluster.worker_cpus:g}, worker_gpus = "
                    f"{actors.cfg.cluster.worker_gpus:g}; free now: "
                    f"{ray.available_resources()})") from None
            except ray.exceptions.RayActorError as e:
                if e.actor_init_failed or attempt == TRIES - 1:
                    raise
                lost.append(r)
        if not lost:
            return
        time.sleep(PAUSE_S)
        for r in lost:
            actors.workers[r] = new_worker(actors, r, dense_state, step_index)


def form_group(actors, ranks: list[int]) -> None:
    """Workers ``ranks`` (built, not training: new or paused; an elastic shadow run's: their
    rounds paused) form a new gloo group, with group ranks in the order given; a group that
    steps together (sync, hybrid) gives each its share of the global batch (``shares``)."""
    n = len(ranks)
    sizes = (shares(global_batch(actors.cfg), n) if actors.facts.joins == JOIN_REGROUP
             else [None] * n)
    host, port = ray.get(actors.workers[ranks[0]].address.remote())
    ray.get([actors.workers[r].join_group.remote(host, port, n, g, sizes[g])
             for g, r in enumerate(ranks)])


def global_batch(cfg) -> int:
    """Rows of one step of a group: ``train.batch_size`` per worker at ``cluster.workers``
    (an elastic run's maximum): the same whatever the group's size."""
    return cfg.train.batch_size * cfg.cluster.workers


def shares(total: int, n: int) -> list[int]:
    """Each of ``n`` group ranks' rows of a global batch of ``total``: equal, the first
    ``total mod n`` one row more."""
    base, extra = divmod(total, n)
    return [base + (g < extra) for g in range(n)]


def new_worker(actors, rank: int, dense_state: dict | None, step_index: int):
    """A new Worker process for ``rank`` (not waited for)."""
    return Worker.options(**actors.placement.worker(rank)).remote(
        rank, actors.cfg, actors.shards, actors.queue, dense_state, step_index, actors.mode,
        actors.directory)
