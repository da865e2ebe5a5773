"""On the runtime harness: a distributed run that ends without finishing because of its model
(NaN loss in a worker) or its disk (full mid-run) fails in one line and writes its summary.
(The signals, on Ray, with the processes they must leave none of: tests/integration/
test_endings.py.)

Run: pytest -q tests/harness/test_endings_harness.py
"""

import json
import shutil
import threading
import time

import pytest

from harness_config import config
from recsync.distributed.errors import RunFailed
from recsync.run import run


def test_a_diverging_model_stops_the_run_at_that_step_with_its_summary(fake_ray, data,
                                                                      tmp_path):
    cfg = config(data, 'mode="sync"', "cluster.workers=2", "train.dense_lr=1e30",
                 "train.embedding_lr=1e30")
    with pytest.raises(RunFailed, match=r"loss is (nan|inf) at step \d+ of worker \d in mode "
                                        r"'sync'") as failed:
        run(cfg, tmp_path)
    assert "\n" not in str(failed.value)  # one line, no traceback
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "loss is" in summary["error"]
    # nothing of the failed run lives on in the session (the traceback holds its handles)
    assert [a.name for a in fake_ray.actors() if a.inc is not None] == []


@pytest.fixture
def small_disk(mount_tmpfs):
    return mount_tmpfs("size=20m")


def test_a_disk_that_fills_mid_run_fails_with_no_space_left_and_no_temporary_files(
        fake_ray, data, small_disk):
    """Checkpoints every half second; once training runs, a file fills the disk but for a few
    kilobytes (room for the summary, not for a checkpoint)."""
    out = small_disk / "run"
    cfg = config(data, 'mode="async"', "cluster.workers=2", "cluster.ps_shards=2",
                 "train.epochs=1000", 'recovery.kind="partial"',
                 "recovery.checkpoint_every_s=0.5")

    def training() -> bool:  # a metrics line with samples, and the checkpoints folder
        metrics = out / "metrics.jsonl"
        return (metrics.exists() and (out / "checkpoints").exists()
                and any(json.loads(line)["samples"] > 0
                        for line in metrics.read_text().splitlines() if line.strip()))

    def fill():
        deadline = time.monotonic() + 120
        while not training() and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(small_disk / "filler", "wb") as f:
            free = shutil.disk_usage(small_disk).free
            f.write(b"\0" * max(0, free - 64 * 1024))

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
