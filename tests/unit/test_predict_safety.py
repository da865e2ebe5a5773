"""`recsync predict` with untrusted inputs and outputs: --out replaces a file only with
--overwrite and never one of its inputs; a data set hashed into other table sizes than the
model's training data is refused (its scores would be wrong); hidden temporary files of dead
predicts are removed; --builder reaches load_model. Run: pytest -q
tests/unit/test_predict_safety.py"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.data.synthetic import SynthSpec, generate
from recsync.model_dir import export as export_module
from recsync.model_dir import predict as predict_module
from test_export import can_mount_in_user_namespace, train_model_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=512, eval_rows=300, spec=SynthSpec(seed=3, max_table_rows=60),
             processes=1, progress=False)
    return root


@pytest.fixture(scope="module")
def model_dir(data, tmp_path_factory):
    return train_model_dir(data, tmp_path_factory.mktemp("run"))


def predict(*args: str):
    return CliRunner().invoke(main, ["predict", *args])


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_out_replaces_an_existing_file_only_with_overwrite(model_dir, data, tmp_path):
    out = tmp_path / "scores.parquet"
    out.write_bytes(b"yesterday's scores")
    result = predict("--model", str(model_dir), str(data), "--out", str(out))
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"--out {out} exists: pass --overwrite to replace it" in result.output
    assert out.read_bytes() == b"yesterday's scores"
    result = predict("--model", str(model_dir), str(data), "--out", str(out), "--overwrite")
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).num_rows == 300
    assert listing(tmp_path) == ["scores.parquet"]


def test_out_is_never_one_of_its_inputs_not_even_with_overwrite(model_dir, data, tmp_path):
    raw = tmp_path / "rows.csv"
    raw.write_text("label,I1\n1,2\n")
    (tmp_path / "link.csv").symlink_to(raw)
    os.link(raw, tmp_path / "hard.csv")
    data_before, model_before = listing(data), listing(model_dir)
    cases = [(str(raw), raw, "is the input"),                     # the file itself
             (str(raw), tmp_path / "link.csv", "is the input"),   # a symlink to it
             (str(raw), tmp_path / "hard.csv", "is the input"),   # a hard link to it
             (str(tmp_path / "link.csv"), raw, "is the input"),   # read through a link
             (str(data), data / "scores.csv", "is inside the input"),
             (str(data), data / "train" / "x.parquet", "is inside the input"),
             (str(data), model_dir / "scores.csv", "is inside the input")]
    for source, out, says in cases:
        result = predict("--model", str(model_dir), source, "--out", str(out), "--overwrite")
        assert result.exit_code == 2 and says in result.output, (source, out, result.output)
        assert "not even with --overwrite" in result.output and result.output.count("\n") == 1
    assert raw.read_text() == "label,I1\n1,2\n" and (tmp_path / "link.csv").is_symlink()
    assert listing(data) == data_before and listing(model_dir) == model_before


def test_out_into_a_missing_folder_fails_naming_it(model_dir, data, tmp_path):
    out = tmp_path / "missing" / "scores.csv"
    result = predict("--model", str(model_dir), str(data), "--out", str(out))
    assert result.exit_code == 2 and result.output == (
        f"error: --out {out}: its folder {out.parent} does not exist (create it first)\n")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("rows", [40, 100])
def test_a_data_set_hashed_into_other_table_sizes_is_refused(rows, model_dir, tmp_path):
    """The same columns and features, hashed into tables of at most ``rows`` rows (the model's
    data: 60): the ids of a smaller table are in range but mean other values, so the old
    check (only larger tables refused) gave wrong scores with exit 0."""
    other = tmp_path / "other"
    generate(other, rows=64, eval_rows=32, spec=SynthSpec(seed=3, max_table_rows=rows),
             processes=1, progress=False)
    mine = {t["name"]: t["rows"] for t in json.loads((other / "meta.json").read_text())
            ["tables"]}
    model = {t["name"]: t["rows"] for t in json.loads((model_dir / "model.json").read_text())
             ["data"]["tables"]}
    table = next(name for name in mine if mine[name] != model[name])
    result = predict("--model", str(model_dir), str(other), "--out",
                     str(tmp_path / "p.parquet"))
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert (f"table {table} has {mine[table]:,} rows, the model's training data "
            f"{model[table]:,}") in result.output
    assert not (tmp_path / "p.parquet").exists()


def test_a_model_with_larger_tables_than_its_data_scores_that_data(data, tmp_path):
    """model.table_rows makes the model's tables larger than the data's: the ids are still
    those of the data's sizes, so the data it was trained on scores."""
    model_dir = train_model_dir(data, tmp_path / "run", "model.table_rows=128")
    assert {t["rows"] for t in json.loads((model_dir / "model.json").read_text())["tables"]} \
        == {128}
    result = predict("--model", str(model_dir), str(data), "--out", str(tmp_path / "p.csv"))
    assert result.exit_code == 0, result.output


def test_temporary_files_of_dead_predicts_are_removed(model_dir, data, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        left = [f".scores.parquet.tmp-{dead.pid}", f".scores.tmp-{dead.pid}.parquet"]
        # another output's temporary file may be a live process's on another machine
        kept = [f".scores.parquet.tmp-{live.pid}", f".other.csv.tmp-{dead.pid}", "notes.tmp-1",
                ".x.tmp-", "data.csv"]
        (tmp_path / f".dir.tmp-{dead.pid}").mkdir()  # not a file: not ours
        for name in left + kept:
            (tmp_path / name).write_bytes(b"partial")
        result = predict("--model", str(model_dir), str(data), "--out",
                         str(tmp_path / "scores.parquet"))
        assert result.exit_code == 0, result.output
        assert listing(tmp_path) == sorted(kept + ["scores.parquet", f".dir.tmp-{dead.pid}"])
    finally:
        live.kill()
        live.wait()


def test_builder_reaches_load_model_only_when_given(model_dir, data, tmp_path, monkeypatch):
    calls = []

    def load_model(path, **kwargs):
        calls.append(kwargs)
        raise ValueError("stopped after load_model")

    monkeypatch.setattr(predict_module, "load_model", load_model)
    monkeypatch.setattr(export_module, "load_model", load_model)
    for command, out in (("predict", "p.csv"), ("export", "m.pt")):
        args = [command, "--model", str(model_dir), "--out", str(tmp_path / out)]
        args += [str(data)] if command == "predict" else []
        for extra, want in (([], {}), (["--builder", "mine.models:build"],
                                       {"builder": "mine.models:build"})):
            result = CliRunner().invoke(main, args + extra)
            assert result.exit_code == 2 and "stopped after load_model" in result.output
            assert calls.pop() == want
    for command in ("predict", "export"):
        help_text = " ".join(CliRunner().invoke(main, [command, "--help"]).output.split())
        assert "--builder" in help_text and "imported and run" in help_text


PREDICT_ON_TMPFS = """
set -e
mount -t tmpfs -o size=4k tmpfs "$1"
"$2" -m recsync.cli predict --model "$3" "$4" --split train --out "$1/p.csv" 2>&1 \
    || echo "rc=$?"
ls -A "$1"
"""


@pytest.mark.skipif(not can_mount_in_user_namespace(),
                    reason="needs unshare -Urm and tmpfs mounts in a user namespace")
def test_a_full_file_system_fails_in_one_line_and_leaves_no_file(model_dir, data, tmp_path):
    """A 4 KiB tmpfs (in a user namespace: no root), too small for the scores."""
    (tmp_path / "mnt").mkdir()
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", PREDICT_ON_TMPFS, "sh",
                           str(tmp_path / "mnt"), sys.executable, str(model_dir), str(data)],
                          capture_output=True, text=True, timeout=300)
    assert done.stdout == (f"error: [Errno 28] cannot write {tmp_path}/mnt/p.csv: No space "
                           f"left on device\nrc=2\n"), done.stdout + done.stderr[-2000:]
