"""A Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``, every node on
127.0.0.1 with 1 CPU): the run, a process of its own that joins it, spreads its PS shards over
the nodes (each actor's node listed in summary.json ``placement``), and survives a whole node's
death (its raylet and every process on it killed) with partial recovery onto a standby. Nothing
of the cluster is left running afterwards."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from runs import SMALL, trained

NODES = 3
PLACEMENT_LINE = re.compile(r"^placement \((\w+), (\d+) node\(s\)\): (.*)$", re.M)


@pytest.fixture
def three_nodes():
    """Three raylets (the head and two more) of one GCS, on loopback; shut down after."""
    from ray.cluster_utils import Cluster

    from recsync.cluster.ray_session import loopback_node
    args = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
    with loopback_node():
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={**args, "include_dashboard": False})
        for _ in range(NODES - 1):
            cluster.add_node(**args)
    gcs_port = cluster.address.rpartition(":")[2]
    try:
        yield cluster
    finally:
        cluster.shutdown()
    deadline = time.time() + 15
    while (left := _processes_with(gcs_port)) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the cluster left running: {left}"


def _processes_with(port: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line[:160] for line in out.splitlines()
            if f":{port}" in line and "ps -eo" not in line]


def _train(cluster, data, out, *overrides) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "recsync", "train", "--out", str(out)]
    for item in [f"data.path={json.dumps(str(data))}", *SMALL,
                 f"cluster.address={json.dumps(cluster.address)}", *overrides]:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _placement(summary: dict) -> dict:
    p = summary["placement"]
    print("\n" + "\n".join(f"{kind[:-1]} {i}: node {a['node_ip']} {a['node_id'][:8]} "
                           f"pid {a['pid']}" for kind in ("shards", "standbys", "workers")
                           for i, a in enumerate(p[kind])))
    return p


def test_multinode_run_spreads_its_shards_over_the_nodes(three_nodes, data, tmp_path):
    out = tmp_path / "run"
    proc = _train(three_nodes, data, out, 'mode="async"', "cluster.workers=2",
                  f"cluster.ps_shards={NODES}", "cluster.shard_cpus=0.2",
                  "cluster.worker_cpus=0.2", "train.epochs=1")
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    p = _placement(summary)
    assert p["strategy"] == "spread" and len(p["nodes"]) == NODES
    shard_nodes = [a["node_id"] for a in p["shards"]]
    assert len(set(shard_nodes)) == NODES, p  # one shard on each node
    assert set(shard_nodes) == set(p["nodes"])
    assert PLACEMENT_LINE.search(log), log[-2000:]  # and the run says so on its output


def test_node_death_is_survived_with_partial_recovery(three_nodes, data, tmp_path):
    out = tmp_path / "run"
    proc = _train(three_nodes, data, out, 'mode="async"', "cluster.workers=2",
                  "cluster.ps_shards=2", 'recovery.kind="partial"',
                  "recovery.checkpoint_every_s=1.0", "recovery.standby_shards=1",
                  "train.epochs=10")
    head = three_nodes.head_node.node_id
    victim = shard = None
    deadline = time.time() + 120
    lines = []
    while victim is None:  # the run's placement line names each actor's node
        line = proc.stdout.readline()
        assert line and time.time() < deadline, "".join(lines)[-3000:]
        lines.append(line)
        if m := PLACEMENT_LINE.match(line.strip()):
            for part in m.group(3).split("; "):
                node, what = part.split(": ")
                node_id = node.split("(")[1].rstrip(")")
                if not head.startswith(node_id) and "shard " in what:
                    victim = next(n for n in three_nodes.worker_nodes
                                  if n.node_id.startswith(node_id))
                    shard = int(what.split("shard ")[1].split(",")[0])
                    break
            assert victim is not None, f"no shard off the head node: {line}"
    # training, with a checkpoint to recover from
    while not (trained(out) and any((out / "checkpoints").rglob("*.json"))):
        assert proc.poll() is None and time.time() < deadline, "".join(lines)[-3000:]
        time.sleep(0.2)
    three_nodes.remove_node(victim, allow_graceful=False)  # raylet and its processes killed
    rest, _ = proc.communicate(timeout=300)
    log = "".join(lines) + rest
    assert proc.returncode == 0, log[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    _placement(summary)
    assert summary["status"] == "completed", summary.get("error")
    recoveries = [r for r in summary["recovery"]["recoveries"] if r["shard"] == shard]
    assert recoveries and recoveries[0]["kind"] == "partial", summary["recovery"]
    assert recoveries[0]["node_before"]["node_id"] == victim.node_id
    events = [e["event"] for e in summary_events(out) if "partial recovery" in e["event"]]
    assert any(victim.node_id[:8] in e for e in events), events  # the event names the node
    print("\n" + "\n".join(events))
    q = summary["queue"]  # every chunk completed, none twice
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0, q
    assert q["pending"] == 0 and q["completed"] == q["chunks"], q


def summary_events(out) -> list[dict]:
    return [e for line in (out / "metrics.jsonl").read_text().splitlines() if line
            for e in json.loads(line).get("events", [])]


def test_a_request_the_cluster_cannot_meet_fails_at_once_naming_it(ray_cluster, data,
                                                                    tmp_path):
    from recsync.distributed.errors import RunFailed
    from recsync.run.driver import run
    from runs import config
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.worker_gpus=1")
    begin = time.perf_counter()
    with pytest.raises(RunFailed, match=r"cluster.worker_gpus = 1: no node .* GPU"):
        run(cfg, tmp_path)
    assert time.perf_counter() - begin < 30
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "worker_gpus" in summary["error"]
