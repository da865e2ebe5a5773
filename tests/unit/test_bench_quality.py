"""Scenario `quality` without the shared data or training: the baselines on a small synthetic
data set converted as a user would, the skip lines (a sample absent, no label column,
LightGBM not installed) and the ratios the issue's checks read.
Run: pytest -q tests/unit/test_bench_quality.py"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import recsync
from recsync.bench import quality, quality_baselines as qb
from recsync.bench.quality_report import (auc_standard_error, chosen_es_model, overview, ratios,
                                          sample_section)
from recsync.bench.quality_samples import SAMPLES, Sample, available, missing_label
from recsync.data.holdout import held_rows
from recsync.data.reader import Dataset

SCHEMA = """
[input]
delimiter = ","
header = true

[label]
column = "click"

[defaults]
table_rows = 1_000

[split]
eval_fraction = 0.25

[[dense]]
name = "x"

[[categorical]]
name = "user"

[[categorical]]
name = "noise"

[[multi_hot]]
name = "tags"
separator = "|"
max_len = 4
pooling = "mean"
"""


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """1,600 rows whose click depends on the user, on x and on tag 7: (train, eval) columns
    and the eval AUC of the true click probabilities (the best any model can do)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("quality")
    n = 1600
    user = rng.integers(0, 40, n)
    x = rng.normal(size=n)
    tags = [rng.choice(10, rng.integers(0, 4), replace=False) for _ in range(n)]
    logit = -1.5 + 1.5 * (user % 4 == 0) + 0.8 * x + np.array([1.5 * (7 in t) for t in tags])
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    lines = ["click,x,user,noise,tags"] + [
        f"{c},{xi:.4f},u{u},n{rng.integers(0, 500)},{'|'.join(f't{v}' for v in t)}"
        for c, xi, u, t in zip(click, x, user, tags)]
    (root / "rows.csv").write_text("\n".join(lines) + "\n")
    (root / "schema.toml").write_text(SCHEMA)
    recsync.convert(root / "rows.csv", root / "data", schema=root / "schema.toml",
                    progress=False)
    ds = Dataset(root / "data")
    from sklearn.metrics import roc_auc_score
    bayes_auc = roc_auc_score(click[1200:], logit[1200:])
    return qb.columns(ds, "train"), qb.columns(ds, "eval"), bayes_auc


def test_columns_hold_every_row_and_the_split_cuts_the_validation_slice_as_training_does(
        synthetic):
    train, eval_, bayes_auc = synthetic
    assert (len(train), len(eval_)) == (1200, 400)
    fit, valid = train.split(qb.VALIDATION)
    assert len(valid) == held_rows(len(train), qb.VALIDATION) == 240
    (values, offsets), = train.multi
    (fv, fo), (vv, vo) = fit.multi[0], valid.multi[0]
    assert len(fo) == len(fit) + 1 and len(vo) == len(valid) + 1
    assert np.array_equal(np.concatenate([fv, vv]), values)  # the bags, cut at the same row
    assert fo[-1] + vo[-1] == offsets[-1]


def test_logistic_regression_learns_the_signal_and_beats_the_constant(synthetic):
    train, eval_, bayes_auc = synthetic
    lr, constant = qb.logistic_baseline(train, eval_), qb.constant_baseline(train, eval_)
    assert bayes_auc - 0.03 < lr["auc"] <= bayes_auc + 0.01, (lr, bayes_auc)
    assert lr["logloss"] < constant["logloss"] - 0.03, (lr, constant)
    assert lr["C"] in qb.C_GRID and set(lr["validation_logloss_by_C"]) == set(
        map(str, qb.C_GRID))
    assert lr["cpu_s"] > 0


def test_lightgbm_learns_the_signal_with_rounds_by_early_stopping(synthetic):
    pytest.importorskip("lightgbm")
    train, eval_, bayes_auc = synthetic
    gbm, constant = qb.lightgbm_baseline(train, eval_), qb.constant_baseline(train, eval_)
    assert bayes_auc - 0.04 < gbm["auc"] <= bayes_auc + 0.01, (gbm, bayes_auc)
    assert gbm["logloss"] < constant["logloss"] - 0.03, (gbm, constant)
    assert 1 <= gbm["rounds"] < qb.LGBM_MAX_ROUNDS and gbm["cpu_s"] > 0


def test_tree_features_mark_unseen_ids_missing_and_give_multi_hot_columns(synthetic):
    train, _, _ = synthetic
    fit, valid = train.split(qb.VALIDATION)
    features = qb.TreeFeatures(fit)
    m = features(valid)
    assert features.categorical == [0, 1]
    # single-hot codes, the dense column, 10 tags' columns and the bag's length
    assert m.shape == (len(valid), 2 + 1 + 10 + 1)
    seen = np.isin(valid.ids[:, 1], fit.ids[:, 1])
    assert np.isnan(m[~seen, 1]).all() and not np.isnan(m[seen, 1]).any()
    assert np.allclose(m[:, 3:13].sum(1)[m[:, 13] > 0], 1.0)  # mean pooling: weights sum to 1


def test_lightgbm_not_installed_is_a_skip_line_not_a_failure(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # import lightgbm raises ImportError
    line = qb.lightgbm_missing()
    assert line.startswith("LightGBM arm skipped: lightgbm is not installed")
    assert "recsync[bench]" in line


def test_absent_samples_are_skipped_with_a_line_naming_the_file(tmp_path):
    measured, skipped = available(tmp_path)
    assert measured == [] and set(skipped) == {s.name for s in SAMPLES}
    assert all("is not there" in why and "RECSYNC_SHARED_DATA" in why
               for why in skipped.values())


def test_the_scenario_without_any_sample_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYNC_SHARED_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        quality.run(tmp_path / "out", 1.0)


def test_a_file_without_the_label_column_is_skipped_with_the_reason(tmp_path):
    fields = ["1"] * 13 + ["68fd1e64"] * 26
    (tmp_path / "test.txt").write_text("\t".join(fields) + "\n")
    assert "39 fields a line, preset criteo reads 40" in missing_label(
        tmp_path / "test.txt", "criteo")
    (tmp_path / "train.txt").write_text("\t".join(["0"] + fields) + "\n")
    assert missing_label(tmp_path / "train.txt", "criteo") is None
    (tmp_path / "a.csv").write_text("id,hour,C1\n1,2,3\n")
    assert "no column 'click'" in missing_label(tmp_path / "a.csv", "avazu")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "test.txt").write_text("\t".join(fields) + "\n")
    measured, skipped = available(tmp_path, (Sample("s", ("test.txt",), "criteo"),))
    assert measured == [] and "no label column" in skipped["s"]


def _arm(auc, logloss, **extra):
    return {"auc": auc, "logloss": logloss, "auc_spread": 0.0, "logloss_spread": 0.0,
            "cpu_s": 1.0, **extra}


def _sample(lr, lgbm, es, constant=0.5, tuned=None):
    """A sample's results: es is {model: (eval auc, eval log loss, validation log loss)}."""
    arms = {"constant": _arm(0.5, constant), "logistic_regression": _arm(lr, 0.45, C=0.1),
            "lightgbm": _arm(lgbm, 0.44, rounds=30),
            "defaults/dlrm": _arm(lr - 0.01, constant + 0.02)}
    for model, (auc, loss, valid) in es.items():
        arms[f"es/{model}"] = _arm(auc, loss, validation_logloss=valid,
                                   best_eval_samples=[100], stopped=["early_stopping"])
    absent = {}
    if tuned is None:
        absent["tuned"] = "recsync tune is not in this build"
    else:
        arms["tuned"] = _arm(tuned, 0.43, trials=16)
    s = {"arms": arms, "absent": absent, "train_rows": 1000, "validation_rows": 200,
         "eval_rows": 250, "train_ctr": 0.2, "eval_ctr": 0.21, "preset": "avazu", "note": ""}
    s["es_model"] = chosen_es_model(arms)
    return s


def test_the_early_stopping_model_is_chosen_on_validation_never_on_eval():
    s = _sample(0.70, 0.71, {"dlrm": (0.75, 0.44, 0.46), "dcn": (0.72, 0.45, 0.43)})
    assert s["es_model"] == "es/dcn"  # lower validation log loss, lower eval AUC


def test_ratios_take_the_lowest_over_samples_and_leave_out_tuned_until_it_exists():
    samples = {"a": _sample(0.70, 0.71, {"dlrm": (0.72, 0.44, 0.40)}),
               "b": _sample(0.80, 0.79, {"dlrm": (0.78, 0.47, 0.40)}, constant=0.46)}
    values, notes = ratios(samples)
    assert values["defaults_minus_lr_auc_min"] == pytest.approx(-0.02)
    assert "tuned_minus_lgbm_auc_min" not in values and "tuned_minus_lr_auc_min" not in values
    assert "recsync tune is not in this build" in notes["tuned_minus_lgbm_auc_min"]
    # the highest recsync eval log loss over the constant's: sample b's, +0.02 (defaults/dlrm)
    assert values["worst_logloss_minus_constant"] == pytest.approx(0.02)
    assert notes["worst_logloss_minus_constant"] == "at b defaults/dlrm"
    section = sample_section("b", samples["b"])
    assert "- tuned: recsync tune is not in this build" in section
    assert "| es/dlrm | 0.7800 ± 0.0000 | 0.4700 ± 0.0000 | +0.0100 |" in section


def test_the_tuned_ratio_is_written_once_every_sample_has_a_tuned_arm():
    samples = {"a": _sample(0.70, 0.71, {"dlrm": (0.72, 0.44, 0.40)}, tuned=0.73),
               "b": _sample(0.80, 0.79, {"dlrm": (0.78, 0.43, 0.40)}, tuned=0.785)}
    values, notes = ratios(samples)
    assert values["tuned_minus_lgbm_auc_min"] == pytest.approx(-0.005)
    assert notes["tuned_minus_lgbm_auc_min"] == "at b"
    assert values["tuned_minus_lr_auc_min"] == pytest.approx(-0.015)
    assert notes["tuned_minus_lr_auc_min"] == "at b"
    assert "| tuned | 0.7850 ± 0.0000 | 0.4300 ± 0.0000 | -0.0700 | 1.0 | recsync tune, 16 trials" \
        in sample_section("b", samples["b"])
    del samples["b"]["arms"]["lightgbm"]
    samples["b"]["absent"]["lightgbm"] = "LightGBM arm skipped: lightgbm is not installed"
    values, notes = ratios(samples)
    assert "tuned_minus_lgbm_auc_min" not in values
    assert "lightgbm is not installed" in notes["tuned_minus_lgbm_auc_min"]
    assert values["tuned_minus_lr_auc_min"] == pytest.approx(-0.015)


def test_the_former_ratios_stay_on_the_avazu_sample():
    values, _ = ratios({"avazu_head9k": _sample(0.70, 0.71, {"dlrm": (0.72, 0.44, 0.40)})})
    assert values["dlrm_minus_baseline_auc"] == pytest.approx(-0.01)


def test_the_overview_shows_how_noisy_an_auc_is_on_each_eval_split():
    # by hand: Q1 = 0.7/1.3, Q2 = 0.98/1.7; (0.21 + 6 (Q1 - 0.49) + 12 (Q2 - 0.49)) / 91
    # = 0.016906, its square root 0.1300
    assert auc_standard_error(0.7, 7, 13) == pytest.approx(0.1300, abs=5e-4)
    assert auc_standard_error(0.7, 331, 1469) < 0.02
    table = overview({"a": _sample(0.70, 0.71, {"dlrm": (0.72, 0.44, 0.40)})})
    # 52 of 250 positive: sqrt((0.21 + 51 (Q1 - 0.49) + 197 (Q2 - 0.49)) / 10296) = 0.044
    assert "| a | 1,250 | 0.210 | 0.044 | 0.7000 | 0.7100 | 0.7200 (dlrm) | +0.0200 |  |" in table


def test_the_scenario_runs_the_tuned_arm_by_default_and_its_result_reaches_the_ratios(
        synthetic, tmp_path, monkeypatch):
    """quality.run with its default tuned arm, recsync.tune faked (no Ray) and the recsync
    arms' training stubbed: the fake search's best.toml is what the tuned arm trains with the
    scenario's seeds, and the arm reaches the ratios and report."""
    from types import SimpleNamespace

    from recsync.bench import quality_tuned as qt
    folder = tmp_path / "shared" / "s"
    folder.mkdir(parents=True)
    lines = ["click,x,user,noise,tags"] + [
        f"{i % 3 == 0:d},{i / 100:.2f},u{i % 7},n{i},t{i % 5}" for i in range(400)]
    (folder / "rows.csv").write_text("\n".join(lines) + "\n")
    (folder / "schema.toml").write_text(SCHEMA)
    monkeypatch.setenv("RECSYNC_SHARED_DATA", str(tmp_path / "shared"))
    monkeypatch.setenv(qt.TRIALS_ENV, "5")
    monkeypatch.setattr(quality, "available", lambda root: (
        [Sample("s", ("rows.csv",), "schema")], {"other": "not there"}))
    monkeypatch.setattr(quality, "convert_sample", lambda sample, root, out: (recsync.convert(
        folder / "rows.csv", out, schema=folder / "schema.toml", progress=False,
        overwrite=True), out)[1])
    searches, trained = [], []

    def fake_tune(base, space, n, out, **options):
        searches.append((base, (space.read_text()), n, options))
        best = recsync.override(base, **{"model.name": "dcn", "train.dense_lr": 0.02})
        out.mkdir(parents=True)
        path = recsync.save_config(best, out / "best.toml")
        return SimpleNamespace(best_config=path, trials=[SimpleNamespace(status="completed")] * n,
                               best=SimpleNamespace(values={"model.name": "dcn",
                                                            "train.dense_lr": 0.02},
                                                    best_logloss=0.4))

    def fake_train(cfg, out, overwrite=False):
        trained.append((cfg.model.name, cfg.train.seed, cfg.train.dense_lr, str(out)))
        auc = 0.9 if "tuned" in str(out) else 0.6
        return SimpleNamespace(summary={"eval": {"auc": auc + cfg.train.seed / 100,
                                                 "logloss": 0.5, "rows": 100},
                                        "samples_per_s": 1000.0})

    monkeypatch.setattr(recsync, "tune", fake_tune)
    monkeypatch.setattr(recsync, "train", fake_train)
    monkeypatch.setattr(qt, "unavailable", lambda: None)
    result = quality.run(tmp_path / "out", 1.0)
    (base, space, n, options), = searches
    assert n == 5 and space == qt.SPACE and options["grace_period"] == qt.GRACE_EVALS
    assert base.train.validation == qb.VALIDATION and base.train.patience == quality.ES_PATIENCE
    assert base.train.epochs == quality.ES_EPOCHS
    assert [(m, seed, lr) for m, seed, lr, out in trained if "tuned" in out] == [
        ("dcn", seed, 0.02) for seed in quality.SEEDS]
    arm = result["samples"]["s"]["arms"]["tuned"]
    assert arm["trials"] == 5 and arm["model"] == "dcn"
    assert arm["auc"] == pytest.approx(0.91)
    assert arm["cpu_s"] == pytest.approx(arm["search_cpu_s"] + arm["seeds_cpu_s"])
    lr_auc = result["samples"]["s"]["arms"]["logistic_regression"]["auc"]
    assert result["ratios"]["tuned_minus_lr_auc_min"] == pytest.approx(0.91 - lr_auc)
    if "lightgbm" in result["samples"]["s"]["arms"]:
        assert "tuned_minus_lgbm_auc_min" in result["ratios"]
    assert "recsync tune, 5 trials, chosen dcn (dense_lr 0.02)" in result["description"]


def test_the_tuned_arm_is_off_with_zero_trials_and_refuses_a_bad_count(monkeypatch):
    from recsync.bench import quality_tuned as qt
    monkeypatch.delenv(qt.TRIALS_ENV, raising=False)
    assert qt.trials() == qt.TRIALS == 16
    monkeypatch.setenv(qt.TRIALS_ENV, "0")
    assert qt.trials() == 0 and qt.TRIALS_ENV in qt.unavailable()
    monkeypatch.setenv(qt.TRIALS_ENV, "many")
    with pytest.raises(ValueError, match="whole number"):
        qt.trials()


def test_tree_cpu_counts_a_child_process_while_it_lives(tmp_path):
    import subprocess
    from recsync.bench.quality_tuned import TreeCPU
    with TreeCPU(poll_s=0.05) as t:
        child = subprocess.Popen([sys.executable, "-c",
                                  "import time\nt = time.process_time()\n"
                                  "while time.process_time() - t < 0.6: pass\n"
                                  "time.sleep(0.3)"])
        child.wait()
    assert t.processes >= 1 and t.seconds >= 0.5, (t.seconds, t.processes)
