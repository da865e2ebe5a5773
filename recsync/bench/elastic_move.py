"""Scenario `elastic`'s arm ``shard_move``: a PS shard moved off a drained node of a real
two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, both nodes on 127.0.0.1).

The head node holds the driver's actors, the workers and one bundle of the shards' placement
group; the second node has room for one shard bundle only (``SHARD_CPUS`` each), so the spread
placement puts one of the run's three shard processes (2 shards, 1 standby) there. The run's
placement line (its first metrics line's events) names which; once a third of the samples are
trained, the node is drained with `recsync scale --drain-node` if it holds a shard, and the
shard moves (distributed/shard_move.py). Where the spread put the standby there instead, there
is nothing to move: the arm says so and its figures are None.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

from recsync.config import load_config
from recsync.run import scale as scale_requests
from recsync.run.driver import run as run_training

SHARD_CPUS, WORKER_CPUS = 0.6, 0.3
NODE = {"object_store_memory": 100 * 2**20, "node_ip_address": "127.0.0.1"}
PART = re.compile(r"([^;:]+)\(([0-9a-f]+)\): ([^;]+)")


def shard_node(out: Path) -> str | None:
    """The id prefix of a node that holds a PS shard and no standby, from the run's placement
    line (None until it is written, or if there is none)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        for event in json.loads(line).get("events", []) if line.strip() else []:
            if event["event"].startswith("placement ("):
                body = event["event"].split("): ", 1)[1]
                for part in body.split("; "):
                    m = PART.match(part.strip())
                    if m and "shard " in m.group(3) and "standby" not in m.group(3):
                        return m.group(2)
    return None


def run_shard_move(out: Path, data: Path, rows: int) -> dict:
    """The arm's run and figures: {"pls", "lost_updates", "lost_pushes", "downtime_s",
    "moved", "status", "samples_per_s": None (not a throughput arm)}."""
    from ray.cluster_utils import Cluster

    from recsync.cluster.ray_session import loopback_node
    out.mkdir(parents=True, exist_ok=True)
    with loopback_node():
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={**NODE, "num_cpus": 2, "include_dashboard": False})
        second = cluster.add_node(**NODE, num_cpus=1)
    try:
        cfg = load_config(None, [
            f"data.path={json.dumps(str(data))}", 'mode="async"', "cluster.workers=[1, 2]",
            "cluster.ps_shards=2", f"cluster.shard_cpus={SHARD_CPUS}",
            f"cluster.worker_cpus={WORKER_CPUS}", 'cluster.placement="spread"',
            f"cluster.address={json.dumps(cluster.address)}", "train.batch_size=512",
            "model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]", "train.threads=1",
            'recovery.kind="partial"', "recovery.checkpoint_every_s=10",
            "recovery.standby_shards=1", "output.progress=false", "output.plot=false",
            "train.eval_every_samples=1000000000000"])
        asked: dict = {}

        def drain():
            from recsync.bench.elastic import last_line
            while not (out / "summary.json").exists():
                last = last_line(out)
                if last and last["samples"] >= rows / 3:
                    node = shard_node(out)
                    asked["node"] = node
                    if node is not None and second.node_id.startswith(node):
                        scale_requests.ask(out, drain_nodes=[node])
                    return
                time.sleep(0.5)

        thread = threading.Thread(target=drain, name="bench-drain", daemon=True)
        thread.start()
        print("[elastic] shard_move (2-node loopback Ray cluster) ...", flush=True)
        summary = run_training(cfg, out, overwrite=True)
        thread.join(timeout=5)
    finally:
        cluster.shutdown()
    planned = [r for r in summary["recovery"]["recoveries"] if r.get("planned")]
    moved = bool(planned)
    return {"samples_per_s": None, "status": summary["status"], "moved": moved,
            "drained_node": asked.get("node"), "second_node": second.node_id[:8],
            "moves": (summary.get("elastic") or {}).get("shard_moves"),
            "pls": summary["recovery"]["pls"] if moved else None,
            "lost_updates": sum(r["lost_updates"] for r in planned) if moved else None,
            "lost_pushes": summary["recovery"]["lost_pushes"],
            "downtime_s": [r.get("downtime_s") for r in planned],
            "queue": summary["queue"], "auc": summary["eval"]["auc"],
            "note": None if moved else "the second node held the standby, not a shard: "
                                       "nothing to move"}
