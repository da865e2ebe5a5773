"""Data, checkpoints and outputs on an S3-compatible server (moto's, started here on
127.0.0.1): a run reads its data set from s3://, writes its checkpoints and outputs there
(metrics.jsonl while it trains), is stopped (SIGTERM) and resumed from the URL alone by a
process with an empty staging folder (as on another machine), and completes."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from runs import SMALL, trained

pytest.importorskip("s3fs", reason="s3:// needs s3fs (recsync[s3])")
pytest.importorskip("moto.server", reason="the local S3 server is moto's (moto[server])")

BUCKET = "recsync-test"


@pytest.fixture
def s3(monkeypatch):
    """A local S3 server with one bucket; the AWS variables point this process and the runs
    it starts at it. Yields an s3fs filesystem."""
    import s3fs
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(BUCKET)
    try:
        yield fs
    finally:
        server.stop()


def _train(staging, *args) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": "local", "RECSYNC_STAGING": str(staging)}
    return subprocess.Popen([sys.executable, "-m", "recsync", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_remote_storage_run_is_stopped_and_resumed_from_s3(s3, data, tmp_path):
    s3.put(str(data), f"{BUCKET}/data", recursive=True)
    url = f"s3://{BUCKET}/run"
    overrides = [f'data.path="s3://{BUCKET}/data"', *SMALL, 'mode="async"',
                 "cluster.workers=2", "cluster.ps_shards=2", "cluster.object_store_mb=128",
                 'recovery.kind="full"', "recovery.checkpoint_every_s=1.0", "train.epochs=12",
                 "output.upload_every_s=1"]
    first = _train(tmp_path / "staging-a", "--out", url,
                   *[x for o in overrides for x in ("--set", o)])
    job = f"{BUCKET}/run/checkpoints/job"
    deadline = time.time() + 180
    staged = tmp_path / "staging-a" / "s3" / BUCKET / "run"
    metrics = f"{BUCKET}/run/metrics.jsonl"
    while not (trained(staged)  # training, and a job checkpoint of it and metrics are up
               and sum(p.endswith(".json") for p in _files(s3, job)) >= 2
               and _files(s3, metrics)):
        assert first.poll() is None and time.time() < deadline, first.stdout.read()[-3000:]
        time.sleep(0.5)
    first.send_signal(signal.SIGTERM)
    log, _ = first.communicate(timeout=120)
    assert first.returncode != 0 and "interrupted by SIGTERM" in log, log[-3000:]
    stopped = json.loads(s3.cat(f"{BUCKET}/run/summary.json"))  # uploaded however it ended
    assert stopped["status"] == "interrupted" and 0 < stopped["samples"] < 12 * 4096
    first_lines = s3.cat(metrics).decode().splitlines()

    second = _train(tmp_path / "staging-b", "--resume", url)  # nothing of the run here
    log, _ = second.communicate(timeout=400)
    assert second.returncode == 0, log[-4000:]
    summary = json.loads(s3.cat(f"{BUCKET}/run/summary.json"))
    assert summary["status"] == "completed", summary.get("error")
    assert summary["data"] == f"s3://{BUCKET}/data"
    q = summary["queue"]  # the data position went on from the checkpoint: each chunk once
    assert q["completed_more_than_once"] == 0 and q["completed_never"] == 0, q
    names = {p.rpartition("/")[2] for p in _files(s3, f"{BUCKET}/run")}
    assert {"config.toml", "metrics.jsonl", "summary.json", "model.json"} <= names, names
    lines = s3.cat(metrics).decode().splitlines()  # the resumed run appended to the record
    assert lines[:len(first_lines)] == first_lines and len(lines) > len(first_lines)
    assert (tmp_path / "staging-b" / "s3" / BUCKET / "data" / "meta.json").exists()
    print(f"\nstopped at {stopped['samples']:,} samples; resumed and completed: "
          f"{summary['samples']:,} samples, {len(names)} files in {url}")


def _files(s3, path: str) -> list[str]:
    s3.invalidate_cache()
    try:
        return s3.find(path)
    except FileNotFoundError:
        return []
