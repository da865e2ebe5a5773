"""`recsync tune` without Ray: the run's on_eval hook, a trial's config and reports, the table
of trials (statuses, best, files), the checks made before anything starts and the error
without Ray Tune.

    pytest tests/unit/test_tune.py
"""

from __future__ import annotations

import csv
import json
import math
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.config import load_config
from recsync.data.synthetic import SynthSpec, generate
from recsync.run.driver import run
from recsync.tuning import search
from recsync.tuning.space import parse_space
from recsync.tuning.table import TRIALS_DIR, TrialTable
from recsync.tuning.trial import METRIC, TIME_ATTR, plain, report_eval, trial_config

SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         "train.batch_size=128", "output.progress=false", "output.plot=false",
         "output.save_model=false", "train.eval_sample_rows=100000"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=2000, eval_rows=300, spec=SynthSpec(seed=2, max_table_rows=200),
             processes=1, progress=False)
    return root


# -- the hook ----------------------------------------------------------------------------------

def test_the_hook_is_told_of_every_validation_evaluation_and_only_those(data, tmp_path):
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL,
                             "train.validation=0.2", "train.eval_every_samples=400"])
    seen = []
    summary = run(cfg, tmp_path / "run", on_eval=seen.append)
    evals = [json.loads(line)["eval"] for line in open(tmp_path / "run" / "metrics.jsonl")]
    evals = [e for e in evals if e]
    assert len(seen) == len(evals) == summary["stopped"]["validation_evals"] >= 4
    assert [s["samples"] for s in seen] == [e["samples"] for e in evals]
    assert all(s["split"] == "validation" and s["logloss"] > 0 for s in seen)
    # without a validation slice the periodic evaluations score the eval split: not told
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL,
                             "train.eval_every_samples=400"])
    seen.clear()
    run(cfg, tmp_path / "no_validation", on_eval=seen.append)
    assert seen == []


def test_what_the_hook_raises_ends_the_run(data, tmp_path):
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL,
                             "train.validation=0.2", "train.eval_every_samples=400"])

    def stop(result):
        raise SystemExit(0)  # what Ray Tune's report raises in a trial ASHA stopped

    with pytest.raises(SystemExit):
        run(cfg, tmp_path / "run", on_eval=stop)
    assert not (tmp_path / "run" / "summary.json").exists()


# -- a trial -----------------------------------------------------------------------------------

def test_a_trials_config_has_its_values_absolute_paths_and_no_progress_bar(tmp_path):
    base = load_config(None, ['data.path="runs/data/x"', "train.validation=0.1"])
    cfg = trial_config(base.to_toml(), {"train.dense_lr": np.float64(0.02),
                                        "train.batch_size": np.int64(64),
                                        "model.name": "dcn"}, str(tmp_path))
    assert cfg.train.dense_lr == 0.02 and cfg.train.batch_size == 64
    assert cfg.model.name == "dcn" and cfg.train.validation == 0.1
    assert cfg.data.path == str(tmp_path / "runs" / "data" / "x")
    assert cfg.output.progress is False
    assert type(plain(np.int64(3))) is int and plain([1, 2]) == [1, 2]


def test_each_evaluation_is_one_report_counted_from_one_and_a_nan_reads_worst():
    reports = []
    hook = report_eval(reports.append, [0])
    hook({"samples": 100, "logloss": 0.5, "auc": 0.7})
    hook({"samples": 200, "logloss": float("nan"), "auc": None})
    assert reports == [{TIME_ATTR: 1, "samples": 100, METRIC: 0.5, "validation_auc": 0.7},
                       {TIME_ATTR: 2, "samples": 200, METRIC: math.inf,
                        "validation_auc": None}]


# -- the table ---------------------------------------------------------------------------------

def _summary(out, trial, status="completed", auc=0.7, logloss=0.5, cause=None):
    folder = out / TRIALS_DIR / trial
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "status": status, "cause": cause, "eval": {"auc": auc, "logloss": logloss},
        "stopped": {"reason": "epochs"}}))


def test_the_table_says_each_trials_status_and_picks_the_lowest_validation_logloss(tmp_path):
    lines = []
    table = TrialTable(tmp_path, ["train.dense_lr"], 4, echo=lines.append)
    for i, trial in enumerate(["t0", "t1", "t2", "t3"]):
        table.started(trial, {"train.dense_lr": 0.01 * (i + 1)})
    for trial, losses in {"t0": [0.6, 0.5], "t1": [0.7], "t2": [0.55, 0.45]}.items():
        for n, loss in enumerate(losses):
            table.result(trial, {}, {"samples": 100 * (n + 1), METRIC: loss,
                                     "validation_auc": 0.6})
    _summary(tmp_path, "t0")
    table.ended("t0", {})
    table.ended("t1", {})  # no summary.json: ASHA stopped it inside a report
    _summary(tmp_path, "t2", status="failed", cause="the disk is full")
    table.ended("t2", {})
    table.interrupted()  # t3 still running
    status = {t: r.status for t, r in table.rows.items()}
    assert status == {"t0": "completed", "t1": "stopped", "t2": "failed", "t3": "interrupted"}
    assert table.rows["t2"].error == "the disk is full"
    # the lowest validation log loss of the trials that did not fail (t2's config failed)
    assert table.best().trial == "t0"
    assert table.rows["t0"].eval_auc == 0.7 and table.rows["t1"].eval_auc is None
    # one progress line per finished trial, on the console and in tune.log
    assert len(lines) == 3 and lines[0].startswith("trial 1/4 t0 completed")
    assert (tmp_path / "tune.log").read_text().splitlines() == lines
    rows = list(csv.DictReader(open(tmp_path / "trials.csv")))
    assert [r["status"] for r in rows] == ["completed", "stopped", "failed", "interrupted"]
    assert rows[0]["train.dense_lr"] == "0.01" and rows[0]["best_validation_logloss"] == "0.5"
    saved = json.loads((tmp_path / "trials.json").read_text())
    assert saved["trials"][2]["evals"][1] == {"samples": 200, "logloss": 0.45, "auc": 0.6}
    assert table.text().splitlines()[1].startswith("t2")  # the lowest validation log loss first


def test_a_trial_that_failed_before_its_run_keeps_the_errors_last_line(tmp_path):
    table = TrialTable(tmp_path, [], 1, echo=lambda line: None)
    table.started("t0", {})
    table.ended("t0", {}, error="Traceback ...\nValueError: bad data")
    assert table.rows["t0"].status == "failed" and table.rows["t0"].error == "ValueError: bad data"
    assert table.best() is None


# -- before anything starts --------------------------------------------------------------------

def test_the_trials_must_cover_the_grid_evenly():
    base = load_config(None, ["train.validation=0.1"])
    space = parse_space({"model": {"embedding_dim": {"grid": [4, 8]},
                                   "dropout": {"uniform": [0.0, 0.2]}}}, base)
    assert search.check_trials(space, 6) == 3
    with pytest.raises(ValueError, match="--trials 5: the grid keys make 2 combinations"):
        search.check_trials(space, 5)
    with pytest.raises(ValueError, match="--trials 0: give at least 1"):
        search.check_trials(space, 0)


def test_local_trials_ask_for_their_threads_and_distributed_ones_for_a_nominal_cpu():
    base = load_config(None, ["train.validation=0.1", "train.threads=2"])
    local = parse_space({"train": {"dense_lr": {"choice": [0.1]}}}, base)
    assert search.trial_cpus(base, local) == (2.0, False)
    threads = parse_space({"train": {"threads": {"int": [1, 3]}}}, base)
    assert search.trial_cpus(base, threads) == (3.0, False)
    modes = parse_space({"mode": {"choice": ["local", "async"]}}, base)
    assert search.trial_cpus(base, modes) == (0.001, True)  # Ray Tune refuses 0


def test_a_base_without_validation_gets_a_tenth():
    said = []
    cfg = search.with_validation(load_config(), said.append)
    assert cfg.train.validation == search.DEFAULT_VALIDATION == 0.1 and len(said) == 1
    kept = load_config(None, ["train.validation=0.25"])
    assert search.with_validation(kept, said.append) is kept and len(said) == 1


def test_an_earlier_search_in_out_is_refused_unless_overwritten(tmp_path):
    search.prepare_out(tmp_path, overwrite=False)
    (tmp_path / "trials.json").write_text("{}")
    with pytest.raises(FileExistsError, match="already holds a search .*trials.json"):
        search.prepare_out(tmp_path, overwrite=False)
    search.prepare_out(tmp_path, overwrite=True)
    assert not (tmp_path / "trials.json").exists() and (tmp_path / TRIALS_DIR).is_dir()


def test_without_ray_tune_the_command_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray.tune", None)  # import ray.tune raises ImportError
    space = tmp_path / "space.toml"
    space.write_text('"train.dense_lr" = {loguniform = [1e-4, 1e-1]}\n')
    result = CliRunner().invoke(main, ["tune", "--space", str(space), "--trials", "2",
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "pip install 'recsync[tune]'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_bad_space_stops_the_command_before_anything_starts(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text('"train.lr" = {loguniform = [1e-4, 1e-1]}\n')
    result = CliRunner().invoke(main, ["tune", "--space", str(space), "--trials", "2",
                                       "--out", str(tmp_path / "out"),
                                       "--set", "train.validation=0.1"])
    assert result.exit_code == 2, result.output
    assert f"error: {space}: train.lr: unknown config key" in result.output
    assert not (tmp_path / "out").exists()
