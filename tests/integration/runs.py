"""Runs the integration tests start: a small config, `recsync train` as a process of its own,
and the processes a run leaves."""

import json
import os
import subprocess
import sys
import time

from recsync.config import load_config

B = 64
SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         f"train.batch_size={B}", "output.progress=false", "output.plot=false"]


def config(data, *extra):
    return load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, *extra])


def train_cli(out, data, *overrides, **popen) -> subprocess.Popen:
    """`recsync train` of the small config with its own embedded Ray instance (not this
    process's), stdout and stderr together in ``.stdout``."""
    cmd = [sys.executable, "-m", "recsync", "train", "--out", str(out)]
    for item in [f"data.path={json.dumps(str(data))}", *SMALL, "cluster.object_store_mb=128",
                 *overrides]:
        cmd += ["--set", item]
    env = {**os.environ, "RAY_ADDRESS": "local"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen)


def trained(out) -> bool:
    """A metrics record with samples in it."""
    path = out / "metrics.jsonl"
    return path.exists() and any(json.loads(line)["samples"] > 0
                                 for line in path.read_text().splitlines() if line)


def wait_trained(proc: subprocess.Popen, out, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while not trained(out):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read()[-2000:]
        time.sleep(0.5)


def ray_processes_of(driver_pid: int) -> list[str]:
    """Ray's processes of the session a driver started (its session dir ends in the pid), so
    that other Ray instances on the machine do not count."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line[:120] for line in out.splitlines() if f"_{driver_pid}/" in line]


def wait_gone(driver_pid: int, timeout_s: float = 10) -> list[str]:
    deadline = time.time() + timeout_s
    while (left := ray_processes_of(driver_pid)) and time.time() < deadline:
        time.sleep(0.5)
    return left
