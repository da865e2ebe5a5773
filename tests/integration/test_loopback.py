"""An embedded run (`recsync train` with its own Ray instance) listens on loopback only: every
listening TCP socket of the driver and of each process under it (Ray's GCS, raylet and agents,
the actors, the gloo group of sync mode) is bound to 127.0.0.1 or ::1; at exit no process of
it is left and its Ray session folder is gone (tests/unit/test_cluster.py: the rest of
recsync.cluster.ray_session, cluster.keep_ray_logs included).

Run: .venv/bin/pytest -q tests/integration/test_loopback.py
"""

import json
import os
import time
from pathlib import Path

import pytest
import ray  # noqa: F401  (before psutil: it puts the psutil it bundles on sys.path)
import psutil
from runs import train_cli, trained

from recsync.cluster.net import is_loopback

pytestmark = pytest.mark.slow


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _listeners(procs) -> dict[tuple[int, str, int], str]:
    """{(pid, ip, port): process name} of the listening TCP sockets of ``procs`` (an actor's
    name without the method it runs: "ray::Worker")."""
    found = {}
    for p in procs:
        try:
            name = p.name().split(".")[0]
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    found[(p.pid, c.laddr.ip, c.laddr.port)] = name
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def _session_dir(procs) -> Path:
    """The run's Ray session folder, from its raylet's command line."""
    for p in procs:
        try:
            with_session = [a for a in p.cmdline() if a.startswith("--session_dir=")]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if with_session:
            return Path(with_session[0].split("=", 1)[1])
    raise AssertionError("no raylet under the run")


def test_an_embedded_sync_run_listens_on_loopback_only_and_leaves_nothing(data, tmp_path):
    out = tmp_path / "run"
    # an emulated 50 ms per PS call: 80 steps take 8 s or more, time to look at the sockets
    # (one epoch of the session's data is 32 steps per worker: 3 epochs for 80 steps; with
    # one, the run ended while the test read its processes' command lines)
    proc = train_cli(out, data, 'mode="sync"', "cluster.workers=2", "train.max_steps=80",
                     "train.epochs=3",
                     "network.latency_ms=50", "output.log_every_steps=5")
    try:
        deadline = time.time() + 90
        while not trained(out):  # the gloo group is up once samples are counted
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"the run ended or hung before training: "
                            f"{proc.communicate()[0][-2000:]}")
            time.sleep(0.2)
        procs, listening = [], {}
        for _ in range(4):  # processes and sockets come and go: look a few times
            procs = _tree(proc.pid)
            listening.update(_listeners(procs))
            time.sleep(0.5)
        session = _session_dir(procs)
    finally:
        output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0 and "completed" in output, output[-2000:]
    # each shard's direct data path served both workers and refused no one
    per_shard = json.loads((out / "summary.json").read_text())["per_shard"]
    assert per_shard and all(s["channel"] == {"connections": 2, "refused": 0}
                             for s in per_shard), per_shard
    outside = {k: v for k, v in listening.items() if not is_loopback(k[1])}
    assert outside == {}, f"listening beyond loopback: {outside}"
    by_name: dict[str, int] = {}
    for name in listening.values():
        by_name[name] = by_name.get(name, 0) + 1
    # the sockets looked at are the run's: Ray's own, the driver's and each worker's (its Ray
    # core worker and gloo's; rank 0 also serves the group's store)
    assert {"gcs_server", "raylet"} <= set(by_name), by_name
    assert any(pid == proc.pid for pid, _, _ in listening), "none of the driver's"
    assert by_name.get("ray::Worker", 0) >= 5, by_name
    _, alive = psutil.wait_procs(procs[1:], timeout=15)
    assert alive == [], [p.pid for p in alive]
    assert not session.exists(), f"{session} left behind"
    latest = session.parent / "session_latest"
    assert not (latest.is_symlink() and os.readlink(latest) == str(session))
