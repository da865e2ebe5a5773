"""An elastic run on a Ray cluster whose nodes come and go (``ray.cluster_utils.Cluster``, every
node on 127.0.0.1): async with ``cluster.workers = [2, 6]`` and 0.9 CPU per worker starts with
the two workers the head node holds, grows when a node joins, shrinks when that node is removed
without notice, and completes every chunk exactly once with its PS shards in the processes they
started in; and a worker whose process gets SIGTERM (a preemption notice) drains and is replaced.
(The logic on the runtime harness: tests/harness/test_elastic_harness.py.)"""

import json
import os
import signal
import threading
import time

import ray  # noqa: F401  (before psutil: it puts the psutil it bundles on sys.path)
import psutil

from runs import B, config, trained
from test_multinode import _processes_with, _train


def _last(out) -> dict:
    """The last whole record of metrics.jsonl (one being written has no newline yet)."""
    lines = [x for x in (out / "metrics.jsonl").read_text().split("\n")[:-1] if x]
    return json.loads(lines[-1]) if lines else {}


def _stop(proc, cluster) -> None:
    """The test's run (if the test failed midway, it goes too) and cluster, gone."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    cluster.shutdown()


def _completed(out) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", summary.get("error")
    return summary


def _wait(proc, out, test, what: str, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while not ((out / "metrics.jsonl").exists() and test(_last(out))):
        assert proc.poll() is None, f"the run ended before {what}: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, f"not seen in {timeout_s} s: {what}; {_last(out)}"
        time.sleep(0.2)


def test_workers_grow_when_a_node_joins_and_shrink_when_it_is_lost(tmp_path, data):
    from ray.cluster_utils import Cluster

    from recsync.cluster.ray_session import loopback_node
    node = {"object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
    with loopback_node():  # the head holds the shards (no CPU) and two workers
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={**node, "num_cpus": 2, "include_dashboard": False})
    gcs_port = cluster.address.rpartition(":")[2]
    out, proc = tmp_path / "run", None
    try:
        proc = _train(cluster, data, out, 'mode="async"', "cluster.workers=[2, 6]",
                      "cluster.worker_cpus=0.9", "train.epochs=40", "network.latency_ms=3")
        _wait(proc, out, lambda m: m.get("workers") == 2 and m["samples"] > 0, "2 workers train")
        with loopback_node():
            extra = cluster.add_node(**node, num_cpus=2)
        _wait(proc, out, lambda m: m.get("workers") == 4, "4 workers after a node joined")
        cluster.remove_node(extra, allow_graceful=False)  # its raylet and processes killed
        _wait(proc, out, lambda m: m.get("workers") == 2, "2 workers after the node was lost")
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, log[-4000:]
    finally:
        _stop(proc, cluster)
    summary = _completed(out)
    e = summary["elastic"]
    counts = iter(p["workers"] for p in e["timeline"])
    assert all(n in counts for n in (2, 4, 2)), e["timeline"]
    lost = [d["rank"] for d in e["deaths"]]
    assert len(lost) == 2 and {j["node"] for j in e["joins"] if j["rank"] in lost} == {
        extra.node_id}
    # the shards kept their processes: no recovery, the pids they started with
    assert summary["recovery"]["recoveries"] == []
    assert [s["pid"] for s in summary["per_shard"]] == [
        a["pid"] for a in summary["placement"]["shards"]]
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0, q
    assert q["completed"] == q["chunks"] and q["pending"] == 0, q
    print("\n" + "\n".join(f"{p['time_s']:.1f} s: {p['workers']} workers"
                           for p in e["timeline"]))
    deadline = time.time() + 15
    while (left := _processes_with(gcs_port)) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of the cluster left running: {left}"


def test_a_worker_that_gets_sigterm_drains_and_a_new_one_takes_its_place(ray_cluster, data,
                                                                         tmp_path):
    cfg = config(data, 'mode="async"', "cluster.workers=[1, 2]", "cluster.ps_shards=1",
                 f"data.chunk_rows={2 * B}", "train.epochs=20", "network.latency_ms=2")
    summary = _run_with_a_worker_preempted(cfg, tmp_path)
    e = summary["elastic"]
    assert len(e["joins"]) == 3 and e["deaths"] == []  # the two, then one in its place
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0 and q["released"] == 0
    assert summary["samples"] == 20 * 4096  # every sample once: its chunk was finished


def test_a_sync_group_forms_again_without_a_preempted_worker_and_with_a_new_one(ray_cluster,
                                                                              data, tmp_path):
    """Sync's gloo group, formed again in the same processes: at 2 -> 1 (SIGTERM to a worker:
    it hands its chunk over at a step boundary) and 1 -> 2 (a new worker joins from the staying
    one's replica); every sample trained once."""
    cfg = config(data, 'mode="sync"', "cluster.workers=[1, 2]", "cluster.ps_shards=1",
                 f"data.chunk_rows={2 * B}", "train.epochs=12", "network.latency_ms=2")
    summary = _run_with_a_worker_preempted(cfg, tmp_path)
    e = summary["elastic"]
    assert len(e["joins"]) == 3 and e["deaths"] == []
    sizes = [len(f["members"]) for f in e["formations"]]  # the first may be 1 (the minimum
    # built first starts the run)
    assert sizes[-3:] == [2, 1, 2], sizes
    assert len({f["step"] for f in e["formations"]}) == len(sizes)
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0 and q["released"] == 0
    assert summary["samples"] == 12 * 4096


def test_a_shadow_averaging_group_forms_again_without_a_preempted_trainer(ray_cluster, data,
                                                                         tmp_path):
    """Shadow with model averaging (its default): the preempted trainer drains, averaging
    meanwhile, then the group of its rounds is formed again on real gloo in the processes that
    stay (torch's group made anew after the old one was destroyed), and again when a new
    trainer joins from a live replica; every sample trained once."""
    cfg = config(data, 'mode="shadow"', 'shadow.algorithm="ma"', "cluster.workers=[1, 2]",
                 "cluster.ps_shards=1", f"data.chunk_rows={2 * B}", "train.epochs=12",
                 "network.latency_ms=2")
    summary = _run_with_a_worker_preempted(cfg, tmp_path)
    e = summary["elastic"]
    assert len(e["joins"]) == 3 and e["deaths"] == []
    sizes = [len(f["members"]) for f in e["formations"]]
    assert sizes[-3:] == [2, 1, 2] and not any(f["rebuilt"] for f in e["formations"]), sizes
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0 and q["released"] == 0
    assert summary["samples"] == 12 * 4096
    assert summary["shadow"]["syncs"] and all(n > 0 for n in summary["shadow"]["syncs"])


def _run_with_a_worker_preempted(cfg, out) -> dict:
    """The run's summary, one of its worker processes sent SIGTERM once it trains: that worker
    drained (not stopped) as the run's one drain."""
    from recsync.run.driver import run
    told = []
    thread = threading.Thread(target=_preempt_a_worker, args=(out, told), daemon=True)
    thread.start()
    summary = run(cfg, out)
    thread.join(timeout=5)
    assert told, "no worker process found"
    assert summary["status"] == "completed", summary.get("error")
    (drain,) = summary["elastic"]["drains"]
    assert drain["why"].startswith("SIGTERM") and not drain["stopped"]
    return summary


def _preempt_a_worker(out, told: list) -> None:
    """SIGTERM to one worker process of this run (made since it began: an earlier test's may
    still be exiting) once both of its workers train, as a cloud's preemption notice (sent
    while the second is still joining, the leave and the join may be one formation)."""
    since = time.time()
    deadline = since + 120
    while not ((out / "metrics.jsonl").exists() and trained(out)
               and _last(out).get("workers") == 2):
        if time.time() > deadline:
            return
        time.sleep(0.2)
    workers = [p for p in psutil.process_iter(["cmdline", "create_time"])
               if (p.info["cmdline"] or [""])[0].startswith("ray::Worker")
               and p.info["create_time"] >= since - 1]
    if workers:
        os.kill(workers[0].pid, signal.SIGTERM)
        told.append(workers[0].pid)


def test_a_drained_node_loses_its_workers_and_gets_no_new_one(tmp_path, data):
    from ray.cluster_utils import Cluster

    import recsync
    from recsync.cluster.ray_session import loopback_node
    node = {"object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
    with loopback_node():  # two workers on each node
        cluster = Cluster(initialize_head=True, connect=False,
                          head_node_args={**node, "num_cpus": 2, "include_dashboard": False})
        second = cluster.add_node(**node, num_cpus=2)
    out, proc = tmp_path / "run", None
    try:
        proc = _train(cluster, data, out, 'mode="async"', "cluster.workers=[2, 4]",
                      "cluster.worker_cpus=0.9", "train.epochs=30", "network.latency_ms=3")
        _wait(proc, out, lambda m: m.get("workers") == 4 and m["samples"] > 0, "4 workers")
        recsync.scale(out, drain_nodes=[second.node_id[:12]])
        _wait(proc, out, lambda m: m.get("workers") == 2, "2 workers after the drain")
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, log[-4000:]
    finally:
        _stop(proc, cluster)
    summary = _completed(out)
    e = summary["elastic"]
    (request,) = e["requests"]
    (drained,) = request["drained"]
    assert len(drained["workers"]) == 2 and e["drained_nodes"] == [second.node_id]
    assert [d["stopped"] for d in e["drains"]] == [False, False]
    # the workers asked for in their place found no room but the drained node's: none ran
    assert [j for j in e["joins"] if j["started_s"] > request["time_s"]] == []
    q = summary["queue"]
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0 and q["released"] == 0
