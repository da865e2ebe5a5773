"""The cluster section of the config (``[cluster]``): workers (a number, or an elastic run's
range), PS shards, the Ray instance, resources and placement."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from recsync.config_sections import Section


class ClusterConfig(Section):
    workers: int = Field(1, ge=1)
    """worker processes (Ray actors); ignored in local mode. A range ``[min, max]`` makes the
    run elastic (docs/cluster.md): it starts once ``min`` are placed, grows to ``max`` (or the
    target `recsync scale` sets) as nodes allow, and goes on with fewer when workers leave;
    the value read back is then ``max`` and ``workers_min`` holds ``min``"""
    workers_min: int | None = Field(None, ge=1)
    """the elastic run's least number of workers (set by ``workers = [min, max]``; None: the
    run is not elastic)"""
    below_min_timeout_s: float = Field(600.0, gt=0)
    """an elastic run with fewer than ``min`` workers for this long fails, naming what the
    cluster lacks"""
    drain_grace_s: float = Field(120.0, gt=0)
    """a worker told to leave (scale down, SIGTERM) finishes its chunk within this long, or it
    is stopped and its chunk goes back to the queue"""
    ps_shards: int = Field(1, ge=1)
    """parameter-server shards (Ray actors) holding the embedding rows"""
    address: str = ""
    """Ray cluster to join (e.g. "auto" or "10.0.0.1:6379"); empty: start a local Ray instance"""
    object_store_mb: int = Field(512, ge=64)
    """object store size of the embedded Ray instance"""
    keep_ray_logs: bool = False
    """keep the embedded Ray instance's session folder (its logs, under /tmp/ray) after the
    run; by default it is removed at exit"""
    transport: Literal["direct", "ray"] = "direct"
    """how workers' pulls and pushes reach the shards: "direct", a TCP connection of each
    worker to each shard on a port of the shard's node that the OS picks (a call costs a
    fraction of a Ray actor call's: docs/design.md); "ray", as Ray actor calls (for clusters
    whose nodes reach each other only on Ray's own ports). Every other call goes through Ray"""
    push_window: int = Field(2, ge=1)
    """async: pushes a worker may have in flight before it waits for the oldest"""
    worker_cpus: float = Field(0.0, ge=0)
    """CPUs Ray reserves for each worker (0: none, processes share the machine's cores, as on
    the embedded instance; on a cluster set what a worker uses, e.g. its train.threads)"""
    shard_cpus: float = Field(0.0, ge=0)
    """CPUs Ray reserves for each PS shard and each standby (0: none)"""
    worker_gpus: float = Field(0.0, ge=0)
    """GPUs for each worker: > 0 puts its dense model and pulled rows on its GPU and makes
    sync's all-reduce NCCL's (shards stay on CPU)"""
    placement: Literal["auto", "spread", "pack", "none"] = "auto"
    """where the actors go: "spread" (shards, standbys and workers across nodes, best effort),
    "pack" (on as few nodes as fit), "none" (Ray's default scheduling); "auto": "spread" where
    the Ray cluster has more than one node, else "none" """
    placement_timeout_s: float = Field(30.0, gt=0)
    """how long the run waits for the cluster to place its actors before it fails naming what
    is missing (a request that no node can ever meet fails at once)"""
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    """Ray runtime environment for the run's processes when joining a cluster (e.g.
    {py_modules = ["mymodels"], pip = ["..."]}); a model builder's module that is not
    installed is added to py_modules"""

    @model_validator(mode="before")
    @classmethod
    def _workers_range(cls, data):
        """``workers = [min, max]``: ``workers`` = max, ``workers_min`` = min."""
        if not isinstance(data, dict) or not isinstance(data.get("workers"), (list, tuple)):
            return data
        span = data["workers"]
        if (len(span) != 2 or not all(isinstance(n, int) and not isinstance(n, bool)
                                      for n in span) or not 1 <= span[0] <= span[1]):
            raise ValueError(f"cluster.workers = {list(span)}: a number, or a range [min, max] "
                             f"of two whole numbers with 1 <= min <= max")
        if data.get("workers_min") is not None:
            raise ValueError("cluster.workers is a range [min, max]: leave out "
                             "cluster.workers_min (the range sets it)")
        return {**data, "workers": span[1], "workers_min": span[0]}

    @model_validator(mode="after")
    def _min_not_above_max(self):
        if self.workers_min is not None and self.workers_min > self.workers:
            raise ValueError(f"cluster.workers_min = {self.workers_min} is more than "
                             f"cluster.workers = {self.workers}")
        return self

    @property
    def elastic(self) -> bool:
        """Whether the number of workers may change during the run."""
        return self.workers_min is not None and self.workers_min < self.workers

    @property
    def min_workers(self) -> int:
        return self.workers if self.workers_min is None else self.workers_min
