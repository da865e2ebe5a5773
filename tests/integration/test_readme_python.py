"""The README's "Use it from Python" example runs as written (a process of its own, with its
own embedded Ray), from a directory laid out as the repository's root with ../shared/data
beside it. Skipped where the shared samples are absent. Run:
pytest -q tests/integration/test_readme_python.py"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recsync.bench.quality import shared_data_dir

ROOT = Path(__file__).resolve().parents[2]
SHARED = shared_data_dir()


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Use it from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared samples at {SHARED}")
def test_readme_python_example_trains_a_user_model_in_gba(tmp_path):
    work = tmp_path / "repo"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(SHARED)
    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", readme_example()], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^completed eval AUC 0\.\d{4}, log loss \d\.\d{4}$", proc.stdout, re.M)
    summary = json.loads((work / "runs" / "avazu-gba" / "summary.json").read_text())
    assert summary["mode"] == "gba" and summary["samples"] == 7199
    assert (work / "avazu-gba.toml").is_file()
