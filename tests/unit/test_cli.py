"""The `recsync` command: output on success, "error: ..." and exit status 2 on user errors."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from recsync.cli import main


@pytest.fixture(scope="module", autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_user_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # not an uncaught exception
    assert "Traceback" not in result.output
    for needle in needles:
        assert str(needle) in result.output, (needle, result.output)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "data"
    result = invoke("data", "synth", "--rows", 600, "--eval-rows", 200, "--out", out,
                    "--max-table-rows", 100, "--processes", 1, "--seed", 4)
    return out, result


def test_help():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("train", "data", "plot", "quickstart"):
        assert command in result.output


def test_data_synth_prints_and_writes(synth):
    out, result = synth
    assert result.exit_code == 0, result.output
    assert "wrote 600 train + 200 eval rows" in result.output
    assert "Bayes-optimal AUC" in result.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["rows"] == 600 and meta["splits"]["eval"]["rows"] == 200
    assert meta["source"]["spec"]["seed"] == 4
    assert max(t["rows"] for t in meta["tables"]) == 100
    assert f"{meta['synthetic']['bayes_auc']:.4f}" in result.output


def test_data_synth_refuses_to_overwrite(synth):
    out, _ = synth
    before = (out / "meta.json").read_text()
    result = invoke("data", "synth", "--rows", 100, "--out", out, "--processes", 1,
                    "--max-table-rows", 100)
    assert_user_error(result, "error:", "--overwrite")
    assert (out / "meta.json").read_text() == before


def test_data_synth_bad_rows(tmp_path):
    assert_user_error(invoke("data", "synth", "--rows", 0, "--out", tmp_path / "d"),
                      "error:", "rows must be >= 1")


def test_train_prints_summary(synth, tmp_path):
    out = tmp_path / "run"
    result = invoke("train", "--out", out, "--set", f"data.path={synth[0]}",
                    "--set", "model.embedding_dim=4", "--set", "model.bottom_mlp=[8]",
                    "--set", "model.top_mlp=[8]", "--set", "train.batch_size=100",
                    "--set", "output.plot=false", "--set", "output.progress=false")
    assert result.exit_code == 0, result.output
    assert "completed: 600 samples in 6 steps" in result.output
    assert "eval AUC" in result.output and "on 200 rows" in result.output
    assert "Bayes-optimal" in result.output
    assert (out / "summary.json").is_file() and (out / "config.toml").is_file()
    assert "config.toml, model/ (" in result.output and (out / "model" / "model.json").is_file()


def test_train_with_config_file(synth, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[data]\npath = "{synth[0]}"\n[model]\nembedding_dim = 2\nbottom_mlp = [4]\n'
                   f'top_mlp = [4]\n[train]\nbatch_size = 200\nmax_steps = 2\n'
                   f'[output]\nplot = false\nprogress = false\n')
    result = invoke("train", "--config", cfg, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "400 samples in 2 steps" in result.output


def test_train_bad_set(tmp_path):
    result = invoke("train", "--out", tmp_path / "run", "--set", "train.bogus=1")
    assert_user_error(result, "error:", "train.bogus", "unknown key")
    assert not (tmp_path / "run").exists()  # rejected before anything ran


def test_train_bad_value(tmp_path):
    result = invoke("train", "--out", tmp_path / "run", "--set", "train.batch_size=0")
    assert_user_error(result, "error:", "train.batch_size")


def test_train_malformed_set(tmp_path):
    result = invoke("train", "--out", tmp_path / "run", "--set", "train.batch_size")
    assert_user_error(result, "error:", "expected key=value")


def test_train_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    result = invoke("train", "--config", missing, "--out", tmp_path / "run")
    assert_user_error(result, "error:", missing)


def test_train_missing_data_dir(tmp_path):
    missing = tmp_path / "no_data_here"
    result = invoke("train", "--out", tmp_path / "run", "--set", f"data.path={missing}")
    assert_user_error(result, "error:", missing, "recsync data synth")


def test_train_incomplete_data_dir(synth, tmp_path):
    incomplete = tmp_path / "half"
    incomplete.mkdir()
    result = invoke("train", "--out", tmp_path / "run", "--set", f"data.path={incomplete}")
    assert_user_error(result, "error:", incomplete / "meta.json")


def test_data_criteo_missing_file(tmp_path):
    missing = tmp_path / "train.txt"
    result = invoke("data", "criteo", missing, "--out", tmp_path / "out")
    assert_user_error(result, "error:", missing)
    assert not (tmp_path / "out" / "meta.json").exists()


@pytest.mark.parametrize("value", ["C3=abc", "abc", "C3=1.5"])
def test_table_size_must_be_an_integer(tmp_path, value):
    src = tmp_path / "train.txt"
    src.write_text("0" + "\t1" * 13 + "\ta" * 26 + "\n")
    result = invoke("data", "criteo", src, "--out", tmp_path / "out", "--table-size", value)
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "--table-size" in result.output and repr(value) in result.output
    assert not (tmp_path / "out").exists()


def test_table_size_unknown_table(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text("0" + "\t1" * 13 + "\ta" * 26 + "\n")
    result = invoke("data", "criteo", src, "--out", tmp_path / "out", "--table-size", "C99=5")
    assert_user_error(result, "error:", "C99")


def test_train_resume_refuses_other_options_and_a_run_without_checkpoints(synth, tmp_path):
    out = tmp_path / "run"
    result = invoke("train", "--out", out, "--set", f"data.path={synth[0]}",
                    "--set", "train.max_steps=1", "--set", "output.plot=false",
                    "--set", "output.progress=false")
    assert result.exit_code == 0, result.output
    assert_user_error(invoke("train", "--resume", out, "--overwrite"),
                      "--resume DIR goes on with DIR's own config.toml")
    result = invoke("train", "--resume", out)  # a local run: nothing to resume from
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "the run wrote no checkpoints to resume from" in result.output


def test_bench_help_lists_every_scenario():
    import importlib

    from recsync.bench import SCENARIOS
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    for name in SCENARIOS:
        assert f"  {name} " in result.output
        assert callable(importlib.import_module(f"recsync.bench.{name}").run)
