"""A distributed run ended by a signal or a disk that fills up mid-run writes its summary and
leaves no process: SIGINT (Ctrl-C, to the driver or the terminal's whole process group) and
SIGTERM, in a mode of each family. (A diverging model: tests/harness/test_endings_harness.py.)

Run: .venv/bin/pytest -q tests/integration/test_endings.py
"""

import json
import os
import shutil
import signal
import threading
import time

import pytest
import ray  # noqa: F401  (before psutil: it puts the psutil it bundles on sys.path)
import psutil
from runs import config, train_cli, wait_gone, wait_trained

from recsync.distributed.errors import RunFailed
from recsync.run.driver import run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode, sig, to_group", [
    ("sync", "SIGINT", True),  # Ctrl-C in a terminal: every process of the group gets it
    ("async", "SIGTERM", False),
    ("shadow", "SIGTERM", False),  # 2 Hogwild threads, the shadow thread in its rounds
])
def test_a_signal_ends_the_run_with_its_summary_and_no_process_left(data, tmp_path, mode, sig,
                                                                     to_group):
    out = tmp_path / "run"
    # a session of its own (a process group to signal); SIGINT restored to the default in case
    # this test runs as a background job, whose children inherit an ignored SIGINT
    proc = train_cli(out, data, f'mode="{mode}"', "cluster.workers=2", "train.epochs=1000",
                     "shadow.hogwild_threads=2", start_new_session=True,
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_trained(proc, out)
    tree = psutil.Process(proc.pid).children(recursive=True)
    number = getattr(signal, sig)
    if to_group:
        os.killpg(proc.pid, number)
    else:
        proc.send_signal(number)
    sent = time.time()
    output = proc.communicate(timeout=60)[0]
    assert time.time() - sent < 15, output[-2000:]
    assert proc.returncode == 128 + number, output[-2000:]  # README "How a run ends"
    assert "Traceback" not in output and "SIGTERM received at time" not in output, output
    assert f"interrupted by {sig}" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == f"{sig} received"
    assert summary["samples"] > 0
    assert wait_gone(proc.pid) == []
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert alive == [], [p.pid for p in alive]


@pytest.fixture
def small_disk(mount_tmpfs):
    return mount_tmpfs("size=20m")


def test_a_disk_that_fills_mid_run_fails_with_no_space_left_and_no_temporary_files(
        ray_cluster, data, small_disk):
    """Checkpoints every half second; once training runs, a file fills the disk but for a few
    kilobytes (room for the summary, not for a checkpoint)."""
    out = small_disk / "run"
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=1000", 'recovery.kind="partial"',
                 "recovery.checkpoint_every_s=0.5")

    def training() -> bool:  # a metrics line with samples, and the checkpoints folder
        metrics = out / "metrics.jsonl"
        try:
            return (metrics.exists() and (out / "checkpoints").exists()
                    and any(json.loads(line)["samples"] > 0
                            for line in metrics.read_text().splitlines() if line.strip()))
        except ValueError:  # a line being written
            return False

    def fill():
        deadline = time.monotonic() + 120
        while not training() and time.monotonic() < deadline:
            time.sleep(0.1)
        room = 64 * 1024
        want, written = max(0, shutil.disk_usage(small_disk).free - room), 0
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while written < want:
                written += os.write(fd, bytes(min(2**20, want - written)))
        except OSError:  # a checkpoint took some of it meanwhile: give the room back
            os.ftruncate(fd, max(0, written - room))
        finally:
            os.close(fd)

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    with pytest.raises(RunFailed, match="no space left") as failed:
        run(cfg, out)
    filler.join(timeout=5)
    assert "\n" not in str(failed.value)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "no space left" in summary["error"]
    left = [p for p in out.rglob("*") if ".tmp" in p.name]
    assert left == []
