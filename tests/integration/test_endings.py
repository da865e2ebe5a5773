"""A distributed run ended by a signal writes its summary and leaves no process: SIGINT (Ctrl-C,
to the driver or the terminal's whole process group) and SIGTERM, in a mode of each family. (A
diverging model and a disk that fills up mid-run: tests/harness/test_endings_harness.py.)

Run: .venv/bin/pytest -q tests/integration/test_endings.py
"""

import json
import os
import signal
import time

import pytest
import ray  # noqa: F401  (before psutil: it puts the psutil it bundles on sys.path)
import psutil
from runs import train_cli, wait_gone, wait_trained

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
