"""`ray job submit -- recsync train ...` against a Ray cluster started here (its head on
127.0.0.1 with Ray's job server): the job's working directory carries the config and a user's
model file to the job's processes; the job succeeds and writes its outputs."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp", reason="ray job submit needs ray[default] (recsync[cluster])")

USER_MODEL = '''
import torch
from recsync.model.inputs import concat

class Sum(torch.nn.Module):
    def __init__(self, num_dense):
        super().__init__()
        self.linear = torch.nn.Linear(num_dense, 1)

    def forward(self, dense, embeddings):
        return self.linear(dense).squeeze(1) + concat(embeddings).sum(1)

def build(inputs):
    return Sum(inputs.num_dense)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_with_job_server(monkeypatch):
    """One node with Ray's dashboard (the job server) on loopback; its processes (the job's
    too) run with loopback addresses and without usage reporting; shut down after."""
    from ray.cluster_utils import Cluster

    from recsync.cluster.ray_session import loopback_node
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray's processes: loopback
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = free_port()
    with loopback_node():
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 2, "object_store_memory": 100 * 2**20, "node_ip_address": "127.0.0.1",
            "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port,
            # the job agent's own port: Ray's default (52365) is held by the agent of any
            # other Ray instance on the machine (the session's), and a job needs this one
            "dashboard_agent_listen_port": free_port()})
    try:
        address = f"http://127.0.0.1:{port}"
        wait_for_job_agent(address)
        yield address
    finally:
        cluster.shutdown()


def wait_for_job_agent(address: str, timeout_s: float = 120) -> None:
    """Until the head's job agent has registered: before it, a submission fails with "No
    available agent to submit job, please try again later" (seconds after start on a loaded
    machine). A trivial job is submitted until one is taken."""
    from ray.job_submission import JobStatus, JobSubmissionClient
    deadline = time.time() + timeout_s
    while True:
        try:
            client = JobSubmissionClient(address)
            job = client.submit_job(entrypoint="true")
            break
        except (RuntimeError, OSError) as e:  # not up yet, or no agent yet
            assert time.time() < deadline, f"Ray's job server never took a job: {e}"
            time.sleep(1.0)
    while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED,
                                             JobStatus.STOPPED}:
        assert time.time() < deadline, "the probe job did not end"
        time.sleep(0.5)


def test_job_submit_runs_recsync_train_with_a_users_model(head_with_job_server, data,
                                                         tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "my_model.py").write_text(USER_MODEL)
    (job / "config.toml").write_text(
        f'mode = "gba"\n[data]\npath = {json.dumps(str(data))}\n'
        f'[model]\nname = "my_model.py:build"\n'
        f'[train]\nbatch_size = 64\nepochs = 1\n'
        f'[cluster]\nworkers = 2\nps_shards = 2\n[output]\nprogress = false\nplot = false\n')
    out = tmp_path / "out"
    begin = time.time()
    proc = subprocess.run(
        ["ray", "job", "submit", "--address", head_with_job_server, "--working-dir", str(job),
         "--", "recsync", "train", "--config", "config.toml", "--out", str(out)],
        capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "succeeded" in log, log[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["samples"] == 4096
    assert (out / "metrics.jsonl").exists() and (out / "config.toml").exists()
    assert (out / "model" / "model.json").exists()  # the trained model
    print(f"\njob succeeded in {time.time() - begin:.1f} s; placement: {summary['placement']}")
