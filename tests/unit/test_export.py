"""`recsync export`: the torch.export file of every model (single-hot only, multi-hot, tables
of two dims) scores what `recsync predict` scores; an export that cannot be written (a full
disk, a missing folder, an existing file, the model directory itself) ends in one line and
leaves no file. Run: pytest -q tests/unit/test_export.py"""

from __future__ import annotations

import errno
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from recsync.cli import main
from recsync.data.reader import Chunk, Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.model_dir import outfile
from recsync.model_dir import write_model_dir
from recsync.model_dir.state import local_state
from recsync.run.driver import run
from recsync.run.local_run import build_local_model, train_step
from test_model_dir import config
from test_multi_hot import make_dataset


def train_model_dir(data: Path, out: Path, *extra: str) -> Path:
    """A local model trained 4 steps on ``data``, written as ``out``/model (no Ray)."""
    cfg = config(data, *extra)
    ds = Dataset(data)
    model = build_local_model(cfg.model, cfg.train, ds)
    for batch in ds.batches(Chunk("train", 0, 0, 256), 64):
        train_step(model, batch)
    state = local_state(model, with_optimizer=False)
    return Path(write_model_dir(out, cfg, ds, state.tables, state.dense_state,
                                state.trained)["path"])


@pytest.fixture(scope="module")
def single_hot(tmp_path_factory):
    """Synthetic (Criteo-like) data: 13 dense columns, 26 single-hot features, no multi-hot."""
    data = tmp_path_factory.mktemp("data")
    generate(data, rows=512, eval_rows=300, spec=SynthSpec(seed=3, max_table_rows=60),
             processes=1, progress=False)
    assert not Dataset(data).layout.multi
    return train_model_dir(data, tmp_path_factory.mktemp("run")), data


@pytest.fixture(scope="module")
def multi_hot(tmp_path_factory):
    """Multi-hot sum and mean pooling, a shared table, tables of two dims (wide_deep)."""
    root, _ = make_dataset(tmp_path_factory.mktemp("mh") / "data", train=90, eval_rows=40)
    out = tmp_path_factory.mktemp("mhrun")
    run(config(root, 'model.name="wide_deep"', "train.batch_size=16"), out / "run")
    return out / "run" / "model", root


def predicted(model_dir: Path, data: Path, tmp_path: Path) -> np.ndarray:
    out = tmp_path / "p.parquet"
    result = CliRunner().invoke(main, ["predict", "--model", str(model_dir), str(data),
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    return pq.read_table(out)["score"].to_numpy()


def exported_scores(file: Path, data: Path, rows_per_call: int) -> np.ndarray:
    """The eval split scored by the torch.export file, ``rows_per_call`` rows at a time."""
    module = torch.export.load(str(file)).module()
    ds = Dataset(data)
    scores = []
    for chunk in ds.chunks("eval", 1 << 20):
        for batch in ds.batches(chunk, rows_per_call):
            args = (batch.dense, batch.sparse, *[t for pair in batch.multi for t in pair])
            with torch.no_grad():
                scores.append(module(*args).numpy())
    return np.concatenate(scores)


@pytest.mark.parametrize("which", ["single_hot", "multi_hot"])
def test_the_torch_export_file_scores_what_predict_scores(which, request, tmp_path):
    model_dir, data = request.getfixturevalue(which)
    result = CliRunner().invoke(main, ["export", "--model", str(model_dir), "--format",
                                       "torch-export", "--out", str(tmp_path / "m.pt2")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("wrote ") and result.output.count("\n") == 1
    want = predicted(model_dir, data, tmp_path)
    for rows_per_call in (1000, 7, 1):  # one call, several, single rows: the batch varies
        got = exported_scores(tmp_path / "m.pt2", data, rows_per_call)
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2", "p.parquet"]


def test_export_into_a_missing_folder_or_onto_a_file_fails_in_one_line(single_hot, tmp_path):
    model_dir, _ = single_hot
    runner = CliRunner()
    missing = tmp_path / "no" / "m.pt"
    result = runner.invoke(main, ["export", "--model", str(model_dir), "--out", str(missing)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"its folder {missing.parent} does not exist" in result.output
    (tmp_path / "m.pt").write_bytes(b"kept")
    result = runner.invoke(main, ["export", "--model", str(model_dir), "--out",
                                  str(tmp_path / "m.pt")])
    assert result.exit_code == 2 and "exists: pass --overwrite" in result.output
    assert (tmp_path / "m.pt").read_bytes() == b"kept"
    result = runner.invoke(main, ["export", "--model", str(model_dir), "--out",
                                  str(tmp_path / "m.pt"), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert torch.jit.load(str(tmp_path / "m.pt")) is not None
    before = sorted(p.name for p in model_dir.iterdir())
    for target in (model_dir / "dense.safetensors", model_dir / "new.pt"):
        result = runner.invoke(main, ["export", "--model", str(model_dir), "--out",
                                      str(target), "--overwrite"])
        assert result.exit_code == 2 and "is inside the input" in result.output
    assert sorted(p.name for p in model_dir.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


class FullDisk(io.FileIO):
    """A file on a disk that fills up after 64 KiB."""

    def write(self, data):
        if self.tell() + memoryview(data).nbytes > 65536:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


@pytest.mark.parametrize("fmt", ["torchscript", "torch-export"])
def test_a_full_disk_fails_in_one_line_and_leaves_no_file(fmt, single_hot, tmp_path,
                                                          monkeypatch):
    model_dir, _ = single_hot
    monkeypatch.setattr(outfile, "open", lambda path, mode: FullDisk(path, "w"),
                        raising=False)
    out = tmp_path / "m.pt2"
    result = CliRunner().invoke(main, ["export", "--model", str(model_dir), "--format", fmt,
                                       "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output == (f"error: [Errno 28] cannot write {out}: No space left on "
                             f"device\n")
    assert not list(tmp_path.iterdir())


EXPORT_ON_TMPFS = """
set -e
mount -t tmpfs -o size=32k tmpfs "$1"
cd "$1"
"$2" -m recsync.cli export --model "$3" --format "$4" --out "$1/m.pt2" 2>&1 || echo "rc=$?"
ls -A "$1"
"""


def can_mount_in_user_namespace() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not can_mount_in_user_namespace(),
                    reason="needs unshare -Urm and tmpfs mounts in a user namespace")
@pytest.mark.parametrize("fmt", ["torchscript", "torch-export"])
def test_a_real_full_file_system_fails_in_one_line(fmt, single_hot, tmp_path):
    """A 32 KiB tmpfs (in a user namespace: no root), too small for the file: torch writing
    to it directly aborted the process (exit 134, a C++ stack dump, its partial file left)."""
    model_dir, _ = single_hot
    (tmp_path / "mnt").mkdir()
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", EXPORT_ON_TMPFS, "sh",
                           str(tmp_path / "mnt"), sys.executable, str(model_dir), fmt],
                          capture_output=True, text=True, timeout=300)
    assert done.stdout == (f"error: [Errno 28] cannot write {tmp_path}/mnt/m.pt2: No space "
                           f"left on device\nrc=2\n"), done.stdout + done.stderr[-2000:]


def test_leftovers_of_dead_exports_are_removed_and_a_live_ones_kept(single_hot, tmp_path):
    model_dir, _ = single_hot
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = [f".m.pt.tmp-{dead.pid}", f".m.tmp-{dead.pid}.pt",  # both namings
                 f".m.pt.tmp-{live.pid}", f".other.pt2.tmp-{dead.pid}", ".notes.tmp-x",
                 "keep.tmp-1"]
        for name in names:
            (tmp_path / name).write_bytes(b"x" * 100)
        result = CliRunner().invoke(main, ["export", "--model", str(model_dir), "--out",
                                           str(tmp_path / "m.pt")])
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["m.pt", f".m.pt.tmp-{live.pid}", f".other.pt2.tmp-{dead.pid}", ".notes.tmp-x",
             "keep.tmp-1"])
    finally:
        live.kill()
        live.wait()

