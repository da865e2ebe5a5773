"""recsync from Python: configs loaded, overridden and saved; a local run trained and its
result read back. Run: pytest -q tests/unit/test_api.py"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import recsync
from recsync.data.synthetic import SynthSpec, generate


def test_import_recsync_is_light():
    """`import recsync` loads neither torch nor Ray (the command's start-up stays fast)."""
    code = ("import sys, recsync; print(sorted(m for m in ('torch', 'ray') if m in sys.modules));"
            " recsync.override")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_recsync_run_keeps_the_names_of_the_module_it_was_and_loads_them_on_first_use():
    """`from recsync.run import run` (and every public name run.py had, now run/driver.py's)
    works; importing a part of the package (run/signals.py, as the command does) loads no torch."""
    code = ("import sys, recsync.run.signals; print('torch' in sys.modules); "
            "from recsync.run import run, resume_point; print(run.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "recsync.run.driver"]
    import recsync.run
    driver = Path(recsync.run.__file__).with_name("driver.py")
    defined = set()
    for node in ast.parse(driver.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
    assert sorted(recsync.run.__all__) == sorted(n for n in defined if not n.startswith("_"))
    assert all(callable(getattr(recsync.run, n)) or n == "RUN_FILES" for n in recsync.run.__all__)


def test_override_checks_values_like_a_config_file(tmp_path):
    cfg = recsync.load_config()
    new = recsync.override(cfg, 'mode="gba"', **{"train.batch_size": 256, "cluster.workers": 2})
    assert (new.mode, new.train.batch_size, new.cluster.workers) == ("gba", 256, 2)
    assert cfg.train.batch_size == 4096  # a copy: the original is unchanged
    with pytest.raises(recsync.ConfigError, match="train.batch_size"):
        recsync.override(cfg, **{"train.batch_size": 0})
    path = recsync.save_config(new, tmp_path / "run.toml")
    assert recsync.load_config(path) == new


def test_train_returns_the_summary_and_the_outputs(tmp_path):
    data = tmp_path / "data"
    generate(data, rows=2048, eval_rows=512, spec=SynthSpec(seed=1, max_table_rows=50),
             processes=1, progress=False)
    cfg = recsync.override(recsync.load_config(), **{
        "data.path": str(data), "train.batch_size": 256, "model.bottom_mlp": [8],
        "model.top_mlp": [8], "model.embedding_dim": 4, "output.progress": False,
        "output.plot": False})
    result = recsync.train(cfg, out=tmp_path / "run")
    assert result.status == "completed" and result.summary["samples"] == 2048
    assert result.eval["rows"] == 512 and 0 <= result.eval["auc"] <= 1
    assert result.summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result.metrics() and result.metrics()[-1]["samples"] == 2048
    with pytest.raises(FileExistsError):
        recsync.train(cfg, out=tmp_path / "run")
