"""run.run: the output contract (config.toml, metrics.jsonl, summary.json, training.png),
max_steps, Ctrl-C, and `recsync plot`."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from click.testing import CliRunner

from recsync.cli import main
from recsync.config import load_config
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.core import read_jsonl
from recsync.metrics.plot import plot_runs
from recsync.run import local_run
from recsync.run.driver import run
from recsync.run.signals import Interrupted

TRAIN_ROWS, EVAL_ROWS, BATCH = 1200, 300, 50


@pytest.fixture(scope="module", autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=TRAIN_ROWS, eval_rows=EVAL_ROWS, spec=SynthSpec(seed=2, max_table_rows=200),
             processes=1, progress=False)
    return root


def config(data, *extra):
    return load_config(None, [
        f"data.path={json.dumps(str(data))}", "model.embedding_dim=4", "model.bottom_mlp=[8]",
        "model.top_mlp=[8]", f"train.batch_size={BATCH}", "output.progress=false",
        "output.log_every_steps=5", *extra])


@pytest.fixture(scope="module")
def run2(data, tmp_path_factory):
    """Two epochs; plot on."""
    out = tmp_path_factory.mktemp("run2")
    cfg = config(data, "train.epochs=2")
    return cfg, out, run(cfg, out)


def test_config_toml_loads_back_with_the_values_the_run_used(run2):
    """The default dense warm-up (-1) is written as the steps used: 2 epochs x 1200 rows /
    50 = 48 steps, a tenth of them is 4."""
    cfg, out, _ = run2
    saved = load_config(out / "config.toml")
    assert saved.train.dense_warmup_steps == 4
    assert saved == cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"dense_warmup_steps": 4})})


def test_metrics_records(run2):
    cfg, out, summary = run2
    records = read_jsonl(out / "metrics.jsonl")
    assert records
    keys = {"time_s", "samples", "step", "loss", "samples_per_s", "mode", "worker_step_s",
            "staleness", "events", "eval"}
    for r in records:
        assert keys <= set(r), keys - set(r)
        assert r["mode"] == "local"
        assert math.isfinite(r["loss"]) and r["loss"] > 0
        assert isinstance(r["worker_step_s"], list) and len(r["worker_step_s"]) == 1
        assert r["events"] == []
        assert r["samples"] == r["step"] * BATCH  # 1200 rows: every batch is full
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert all(r["step"] % 5 == 0 or r["eval"] for r in records)  # log_every_steps, or an eval
    times = [r["time_s"] for r in records]
    assert times == sorted(times)
    evals = [r["eval"] for r in records if r["eval"]]
    assert len(evals) == 8  # eval_every_samples = 0: eight evaluations over the run
    for e in evals:
        assert {"auc", "logloss", "ne", "calibration", "rows", "samples", "time_s",
                "eval_s"} <= set(e)
        assert e["rows"] == EVAL_ROWS  # eval_sample_rows (50,000) capped at the split
    assert evals[-1]["samples"] == summary["samples"]
    assert summary["evals"] == evals
    periodic = summary["periodic_eval"]  # local training waits for each evaluation
    assert periodic["count"] == 8 and periodic["paused_s"] == periodic["eval_s"] > 0
    assert periodic["eval_s"] == pytest.approx(sum(e["eval_s"] for e in evals))


def test_summary_has_every_key(run2, data):
    cfg, out, returned = run2
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(returned))  # the file is what run() returned
    assert summary["status"] == "completed"
    assert summary["mode"] == "local"
    assert len(summary["modes"]) == 1
    (mode,) = summary["modes"]
    assert set(mode) == {"mode", "from_s", "to_s", "cause"}
    assert mode["mode"] == "local" and mode["from_s"] == 0.0
    assert 0 <= summary["startup_s"] < summary["wall_s"]
    # modes' periods are on the training clock: from the first step to the end
    assert mode["to_s"] == pytest.approx(summary["wall_s"] - summary["startup_s"], abs=0.05)
    assert summary["workers"] == 1
    assert summary["ps_shards"] == 0
    assert summary["samples"] == 2 * TRAIN_ROWS
    assert summary["steps"] == 2 * TRAIN_ROWS // BATCH
    assert summary["wall_s"] > 0
    assert summary["samples_per_s"] > 0
    assert summary["samples_per_s"] >= summary["samples"] / summary["wall_s"]  # evals excluded
    ev = summary["eval"]
    assert set(ev) >= {"auc", "logloss", "ne", "calibration", "rows", "bayes_auc",
                       "bayes_logloss"}
    assert ev["rows"] == EVAL_ROWS
    assert 0 < ev["auc"] < 1 and ev["logloss"] > 0 and ev["ne"] > 0 and ev["calibration"] > 0
    meta = json.loads((data / "meta.json").read_text())
    assert ev["bayes_auc"] == meta["synthetic"]["bayes_auc"]
    assert ev["bayes_logloss"] == meta["synthetic"]["bayes_logloss"]
    assert summary["staleness"] == {"mean": None, "p99": None, "max": None}
    assert summary["failures"] == []
    assert set(summary["recovery"]) == {"kind", "pls", "checkpoint_overhead_frac", "checkpoints",
                                        "checkpoint_blocked_s", "checkpoint_copy_s",
                                        "checkpoint_blocked_parts_s",
                                        "checkpoint_dir", "written_per_shard", "write_s_mean",
                                        "recoveries", "interval_decision", "rows",
                                        "samples_redone",
                                        "partial_checkpoints", "overhead",
                                        "final_job_checkpoint", "lost_pushes", "worker_restarts",
                                        "standby_shards", "downtime_per_failure",
                                        "take_overs"}
    assert summary["recovery"]["checkpoints"] == 0
    assert summary["recovery"]["overhead"]["total_s"] == 0
    assert summary["stragglers_emulated"] is False


def test_training_png(run2):
    _, out, _ = run2
    png = out / "training.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_max_steps_is_honoured(data, tmp_path):
    cfg = config(data, "train.max_steps=7", "train.epochs=3", "output.plot=false")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    assert summary["steps"] == 7
    assert summary["samples"] == 7 * BATCH
    assert not (tmp_path / "training.png").exists()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert records[-1]["step"] == 7  # the last interval is logged (it ends with an eval)


def test_threads_setting_is_applied(data, tmp_path):
    torch.set_num_threads(2)
    run(config(data, "train.max_steps=1", "train.threads=1", "output.plot=false"), tmp_path)
    assert torch.get_num_threads() == 1


def test_same_config_same_result(data, tmp_path):
    a = run(config(data, "train.max_steps=10", "output.plot=false"), tmp_path / "a")
    b = run(config(data, "train.max_steps=10", "output.plot=false"), tmp_path / "b")
    assert a["eval"] == b["eval"]
    la = [r["loss"] for r in read_jsonl(tmp_path / "a" / "metrics.jsonl")]
    lb = [r["loss"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    assert la == lb


def test_keyboard_interrupt_still_writes_the_summary(data, tmp_path, monkeypatch):
    real, calls = local_run.train_step, []

    def step(model, batch):
        if len(calls) == 9:
            raise KeyboardInterrupt
        calls.append(len(batch))
        return real(model, batch)

    monkeypatch.setattr(local_run, "train_step", step)
    with pytest.raises(Interrupted) as stopped:  # raised again once the summary is written
        run(config(data, "train.epochs=2"), tmp_path)
    assert stopped.value.exit_code == 130
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == "SIGINT received"
    assert summary["steps"] == 9
    assert summary["samples"] == sum(calls) == 9 * BATCH
    assert summary["eval"]["rows"] == EVAL_ROWS  # the work done so far is still evaluated
    records = read_jsonl(tmp_path / "metrics.jsonl")
    # every 5 steps, at the first evaluation (2400 samples / 8 = 300 samples = 6 steps), and
    # the steps since the last record when the run stopped
    assert [r["step"] for r in records] == [5, 6, 9]
    assert (tmp_path / "training.png").is_file()


def test_ctrl_c_during_the_final_evaluation_keeps_the_record(data, tmp_path, monkeypatch):
    calls = []

    def evaluate_once_interrupted(*args):
        calls.append(1)
        raise KeyboardInterrupt  # in the run's own final evaluation; run/driver.py evaluates again

    monkeypatch.setattr(local_run, "final_eval", evaluate_once_interrupted)
    with pytest.raises(Interrupted):
        run(config(data, "output.plot=false"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["samples"] == TRAIN_ROWS
    assert summary["eval"]["rows"] == EVAL_ROWS and len(calls) == 1


def test_a_second_run_into_the_same_dir_is_refused_unless_overwrite(data, tmp_path):
    cfg = config(data, "train.max_steps=3", "output.plot=false")
    run(cfg, tmp_path)
    with pytest.raises(FileExistsError, match="--overwrite"):
        run(cfg, tmp_path)
    run(cfg, tmp_path, overwrite=True)
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")]
    assert steps == sorted(steps) and steps[-1] == 3  # one run's records, not two appended


def test_missing_data_dir(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "nope"))):
        run(config(tmp_path / "nope"), tmp_path / "out")


# ------------------------------------------------------------------------------------ plot

def test_plot_two_runs(run2, data, tmp_path):
    other = tmp_path / "other"
    run(config(data, "train.max_steps=12", "output.plot=false"), other)
    png = tmp_path / "both.png"
    result = CliRunner().invoke(main, ["plot", str(run2[1]), str(other), "--out", str(png)])
    assert result.exit_code == 0, result.output
    assert str(png) in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_plot_without_metrics(run2, tmp_path):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as e:
        plot_runs([run2[1], empty], tmp_path / "x.png")
    assert str(empty / "metrics.jsonl") in str(e.value)
    result = CliRunner().invoke(main, ["plot", str(empty), "--out", str(tmp_path / "y.png")])
    assert result.exit_code == 2
    assert "error:" in result.output and str(empty / "metrics.jsonl") in result.output
    assert not (tmp_path / "y.png").exists()


def test_the_plot_shades_the_periods_a_run_spent_in_another_mode():
    import matplotlib.pyplot as plt

    from recsync.metrics.plot import _shade_switched_modes
    fig, ax = plt.subplots()
    modes = [{"mode": "sync", "from_s": 0.0, "to_s": 30.0, "cause": "config"},
             {"mode": "gba", "from_s": 30.0, "to_s": 60.0, "cause": "auto: ..."},
             {"mode": "sync", "from_s": 60.0, "to_s": 90.0, "cause": "auto: ..."}]
    _shade_switched_modes(ax, {"modes": modes}, "tab:blue", "auto")
    _shade_switched_modes(ax, {"modes": modes[:1]}, "tab:red", "sync_only")  # never switched
    assert len(ax.patches) == 1
    assert ax.patches[0].get_x() == 30.0 and ax.patches[0].get_width() == 30.0
    plt.close(fig)
