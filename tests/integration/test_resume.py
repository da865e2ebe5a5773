"""`recsync train --resume`: a run whose driver is killed goes on from its last complete
checkpoint and ends where an uninterrupted run ends. Each run is a subprocess with its own
embedded Ray (the driver must be killable), so no session fixture here."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import ray  # noqa: F401 - first: it puts the psutil it bundles on sys.path
import psutil

from recsync.checkpoint import files, job
from recsync.data.synthetic import SynthSpec, generate

CONFIG = """mode = "sync"
[data]
path = "{data}"
[model]
embedding_dim = 4
bottom_mlp = [8]
top_mlp = [8]
[train]
batch_size = 64
epochs = 10
[cluster]
workers = 2
ps_shards = 2
[recovery]
kind = "full"
checkpoint_every_s = 1.0
[output]
progress = false
plot = false
"""


def _train(*args) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": "local"}  # each its own Ray instance
    return subprocess.Popen([sys.executable, "-m", "recsync", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _final_parameters(out) -> dict[str, np.ndarray]:
    """The dense replica and every shard's rows, from the run's final checkpoints."""
    root = out / "checkpoints"
    final = files.latest(job.job_dir(root))
    assert final.meta["final"]
    params = {"dense": final.arrays["dense.params"]}
    for shard, sequence in enumerate(final.meta["shard_sequences"]):
        for name, a in files.chain(job.shard_dir(root, shard), sequence)[-1].arrays.items():
            params[f"shard{shard}.{name}"] = a
    return params


def test_resume_after_the_driver_is_killed_ends_with_the_uninterrupted_parameters(tmp_path):
    data = tmp_path / "data"
    generate(data, rows=4096, eval_rows=512, spec=SynthSpec(seed=3, max_table_rows=500),
             processes=1, progress=False)
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG.format(data=data))
    whole = _train("--config", str(cfg), "--out", str(tmp_path / "whole"))
    assert whole.wait(timeout=300) == 0, whole.stdout.read()

    out = tmp_path / "crashed"
    crashed = _train("--config", str(cfg), "--out", str(out))
    deadline = time.monotonic() + 240
    while not (out / "checkpoints" / "job" / "ckpt-000004.json").exists():  # mid-run
        assert crashed.poll() is None and time.monotonic() < deadline, crashed.stdout.read()
        time.sleep(0.2)
    # The driver's machine dies: the driver and every process it started (Ray's, the actors').
    # (Killed alone, it leaves Ray's agents behind for a minute, holding Ray's default ports,
    # which slows the Ray instances that later tests start.)
    tree = psutil.Process(crashed.pid).children(recursive=True)
    crashed.send_signal(signal.SIGKILL)  # no summary is written
    crashed.wait()
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)
    assert not (out / "summary.json").exists()

    resumed = _train("--resume", str(out))
    text = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, text
    assert "resumed from job checkpoint" in text
    a, b = _final_parameters(tmp_path / "whole"), _final_parameters(out)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)

    again = _train("--resume", str(out))  # a completed run has nothing to resume
    text = again.communicate(timeout=120)[0]
    assert again.returncode != 0 and "the run completed" in text
