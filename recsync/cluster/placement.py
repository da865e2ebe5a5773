"""Where a distributed run's actors go on a Ray cluster (``cluster.placement``, docs/cluster.md).

Two placement groups hold a bundle per PS shard and standby, and one per worker, with the
resources each declares (``cluster.shard_cpus``, ``worker_cpus``, ``worker_gpus``). Strategy
"spread" places each group's bundles on as many nodes as it can (a node's death then takes as
few shards as it can), "pack" on as few. An elastic run's workers have no group: each is placed
when a node can hold it (spread where the run spreads), never on a drained node. A bundle must
hold some resource, so an actor that declares none gets a bundle of ``NOMINAL_CPU`` (and uses
none of it beyond what it runs).

The control actors (the work queue, the standby directory) stay on the driver's node: they must
outlive any other node. A request that no node of the cluster can meet, or that the cluster as
a whole cannot, fails at once naming what is missing; one that waits for resources others hold
fails after ``cluster.placement_timeout_s``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
NOMINAL_CPU = 0.001  # a bundle's CPU where its actor declares none (Ray refuses empty bundles)


class PlacementError(RuntimeError):
    """The cluster cannot place the run's actors; the message names what is missing."""


def strategy_for(cfg) -> str:
    """"spread", "pack" or "none": ``cluster.placement`` with "auto" resolved ("spread" where
    the Ray cluster has more than one node alive)."""
    p = cfg.cluster.placement
    if p == "auto":
        return "spread" if sum(1 for n in ray.nodes() if n.get("Alive")) > 1 else "none"
    return p


def _resources(cpus: float, gpus: float = 0.0) -> dict[str, float]:
    r = {"CPU": cpus or NOMINAL_CPU}
    if gpus:
        r["GPU"] = gpus
    return r


@dataclass
class Placement:
    """The run's placement groups (None: Ray's default scheduling): one for the PS shards and
    standbys (bundle i: shard i; a standby takes any free bundle: the one a dead shard left),
    one for the workers (bundle r: worker r, also when restarted)."""

    strategy: str
    shard_cpus: float = 0.0
    worker_cpus: float = 0.0
    worker_gpus: float = 0.0
    shard_group: object = None
    worker_group: object = None  # None in an elastic run: its workers come and go
    avoid: set = field(default_factory=set)  # node ids an elastic run's workers keep off

    @staticmethod
    def _options(group, bundle: int, cpus: float, gpus: float = 0.0) -> dict:
        if group is None:  # "DEFAULT", not None: under Ray Tune a trial's actors would else
            # be captured into the trial's placement group (recsync tune), where they do not fit
            return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": "DEFAULT"}
        return {"num_cpus": cpus or NOMINAL_CPU, "num_gpus": gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=bundle)}

    def shard(self, index: int) -> dict:
        """``.options`` of PS shard ``index``'s process."""
        return self._options(self.shard_group, index, self.shard_cpus)

    def standby(self) -> dict:
        """``.options`` of a standby shard process."""
        return self._options(self.shard_group, -1, self.shard_cpus)

    def worker(self, rank: int) -> dict:
        """``.options`` of worker ``rank``'s process (a restarted one takes the same bundle; an
        elastic run's go wherever Ray places them, spread where the run spreads)."""
        options = self._options(self.worker_group, rank, self.worker_cpus, self.worker_gpus)
        if self.worker_group is None and self.strategy == "spread":
            options["scheduling_strategy"] = "SPREAD"
        if self.avoid:  # drained nodes (elastic runs): anywhere else (Ray labels every node
            # with its id, ray._raylet.RAY_NODE_ID_KEY)
            options["label_selector"] = {NODE_ID_LABEL: f"!in({', '.join(sorted(self.avoid))})"}
        return options

    def remove(self) -> None:
        for group in (self.shard_group, self.worker_group):
            if group is not None:
                remove_placement_group(group)
        self.shard_group = self.worker_group = None


def on_driver_node() -> dict:
    """``.options`` that keep an actor on the driver's node (hard affinity)."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)}


def place(cfg, standbys: int) -> Placement:
    """The run's placement: checked against the cluster, reserved, waited for."""
    c = cfg.cluster
    strategy = strategy_for(cfg)
    check_feasible(cfg, standbys)
    p = Placement(strategy, c.shard_cpus, c.worker_cpus, c.worker_gpus)
    if strategy == "none":
        return p
    shard_bundles = [_resources(c.shard_cpus)] * (c.ps_shards + standbys)
    worker_bundles = [] if c.elastic else [_resources(c.worker_cpus, c.worker_gpus)] * c.workers
    p.shard_group = placement_group(shard_bundles, strategy=strategy.upper())
    groups = [p.shard_group]
    if worker_bundles:  # an elastic run's workers are placed one by one as nodes allow
        p.worker_group = placement_group(worker_bundles, strategy=strategy.upper())
        groups.append(p.worker_group)
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups),
                        timeout=c.placement_timeout_s)
    if len(ready) < len(groups):
        p.remove()
        raise PlacementError(
            f"cluster.placement = {strategy!r}: Ray could not place the run's "
            f"{len(shard_bundles) + len(worker_bundles)} actors in {c.placement_timeout_s:g} s "
            f"(cluster.placement_timeout_s): {_asked(shard_bundles + worker_bundles)} asked, "
            f"{_fmt(ray.available_resources())} free now")
    return p


def check_feasible(cfg, standbys: int) -> None:
    """PlacementError at once where the cluster's nodes, alive now, can never hold the run's
    actors: a resource the cluster lacks in total, or an actor larger than every node."""
    c = cfg.cluster
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    total: dict[str, float] = {}
    for n in nodes:
        for k, v in n.items():
            total[k] = total.get(k, 0.0) + v
    asks = [("PS shard", c.ps_shards + standbys, {"CPU": c.shard_cpus}),
            ("worker", c.min_workers, {"CPU": c.worker_cpus, "GPU": c.worker_gpus})]
    need: dict[str, float] = {}
    for what, count, res in asks:
        for k, v in res.items():
            if not v or not count:
                continue
            need[k] = need.get(k, 0.0) + v * count
            if not any(n.get(k, 0.0) >= v for n in nodes):
                raise PlacementError(
                    f"cluster.{_key(what, k)} = {v:g}: no node of the cluster has {v:g} {k} "
                    f"for a {what} (largest: {max((n.get(k, 0.0) for n in nodes), default=0):g}"
                    f"; nodes alive: {len(nodes)})")
    missing = {k: v - total.get(k, 0.0) for k, v in need.items() if v > total.get(k, 0.0)}
    if missing:
        raise PlacementError(
            f"the run needs {_fmt(need)} ({c.ps_shards} shards + {standbys} standbys x "
            f"{c.shard_cpus:g} CPU, {c.min_workers} workers x {c.worker_cpus:g} CPU + "
            f"{c.worker_gpus:g} GPU); the cluster has {_fmt(total, need)}: missing "
            f"{_fmt(missing)}")


def _key(what: str, resource: str) -> str:
    if what == "PS shard":
        return "shard_cpus"
    return "worker_gpus" if resource == "GPU" else "worker_cpus"


def _fmt(res: dict, only: dict | None = None) -> str:
    keys = only if only is not None else [k for k in ("CPU", "GPU") if k in res]
    return ", ".join(f"{res.get(k, 0.0):g} {k}" for k in keys) or "nothing"


def _asked(bundles: list[dict]) -> str:
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return _fmt(need)


def where() -> dict:
    """The calling process's node (id and address) and pid: each actor reports it."""
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid()}


def node_label(node: dict, down: bool = False) -> str:
    """"10.0.0.2 (1a2b3c4d)": a node's address and the start of its id (", down" added)."""
    return f"{node['node_ip']} ({node['node_id'][:8]}{', down' if down else ''})"


def node_alive(node_id: str | None) -> bool | None:
    """Whether the node is alive in the cluster's view (None: unknown)."""
    if not node_id:
        return None
    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            return bool(n.get("Alive"))
    return None


def actor_nodes(actors) -> dict:
    """Where each of a run's actors (recsync.distributed.actors.RunActors) is now: the
    strategy, the nodes ({id: address}) and, per shard, standby and worker, its node and
    pid."""
    def listed(answers: list[dict]) -> list[dict]:
        return [{"node_id": a["node_id"], "node_ip": a["node_ip"], "pid": a["pid"]}
                for a in answers]
    shards = listed(ray.get([s.where.remote() for s in actors.shards], timeout=60))
    standbys = []
    if actors.directory is not None:
        handles = ray.get(actors.directory.standby_handles.remote(), timeout=60)
        standbys = listed(ray.get([h.where.remote() for h in handles], timeout=60))
    workers = listed(ray.get([actors.workers[r].where.remote() for r in actors.live()],
                             timeout=60))  # an elastic run's: those training
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return {"strategy": actors.placement.strategy, "nodes": nodes, "shards": shards,
            "standbys": standbys, "workers": workers}


def placement_line(p: dict) -> str:
    """One line: which node holds which shards, standbys and workers."""
    by_node: dict[str, list[str]] = {}
    for kind, short in (("shards", "shard"), ("standbys", "standby"), ("workers", "worker")):
        for i, a in enumerate(p[kind]):
            by_node.setdefault(node_label(a), []).append(
                f"{short} {i}")
    return (f"placement ({p['strategy']}, {len(p['nodes'])} node(s)): "
            + "; ".join(f"{node}: {', '.join(what)}" for node, what in by_node.items()))
