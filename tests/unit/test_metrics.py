"""NE and calibration against hand computations, their undefined cases, and the JSON they
leave in metrics.jsonl."""

import json
import math

import numpy as np
import pytest

from recsync.metrics.core import MetricsLog, auc_logloss, binary_entropy


def test_ne_and_calibration_by_hand():
    labels = np.array([1, 0, 0, 0])
    probs = np.array([0.5, 0.5, 0.25, 0.25])
    m = auc_logloss(labels, probs)
    # log loss: -(ln 0.5 + ln 0.5 + 2 ln 0.75) / 4; CTR 1/4, entropy -(1/4 ln 1/4 + 3/4 ln 3/4)
    logloss = -(2 * math.log(0.5) + 2 * math.log(0.75)) / 4
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert m["logloss"] == pytest.approx(logloss)
    assert m["ne"] == pytest.approx(logloss / entropy)
    assert m["calibration"] == pytest.approx((1.5 / 4) / 0.25)  # mean prediction 0.375
    assert m["ctr"] == pytest.approx(0.25)
    assert m["auc"] == pytest.approx(5 / 6)  # 1 positive over 3 negatives: 2 wins, 1 tie of 3
    assert m["rows"] == 4 and "note" not in m


def test_predicting_the_ctr_gives_ne_one_and_calibration_one():
    labels = np.array([1, 0, 0, 1, 0])
    m = auc_logloss(labels, np.full(5, 0.4))
    assert m["ne"] == pytest.approx(1.0)
    assert m["calibration"] == pytest.approx(1.0)


def test_weights_count_as_repeated_rows():
    labels, probs = np.array([1, 0, 0]), np.array([0.7, 0.2, 0.4])
    weighted = auc_logloss(labels, probs, np.array([2.0, 1.0, 3.0]))
    repeated = auc_logloss(np.repeat(labels, [2, 1, 3]), np.repeat(probs, [2, 1, 3]))
    for key in ("auc", "logloss", "ne", "calibration", "ctr"):
        assert weighted[key] == pytest.approx(repeated[key])
    assert weighted["ctr"] == pytest.approx(2 / 6)
    assert weighted["calibration"] == pytest.approx((1.4 + 0.2 + 1.2) / 6 / (2 / 6))


def test_binary_entropy():
    assert binary_entropy(0.5) == pytest.approx(math.log(2))
    assert binary_entropy(0.0) == binary_entropy(1.0) == 0.0


@pytest.mark.parametrize("label", [0, 1])
def test_one_class_is_null_with_a_reason_never_inf(tmp_path, label):
    m = auc_logloss(np.full(3, label), np.array([0.1, 0.5, 0.9]))
    assert math.isnan(m["auc"]) and math.isnan(m["ne"])
    assert math.isfinite(m["logloss"])
    assert "one class" in m["note"]
    if label == 1:  # mean prediction over a CTR of 1: defined
        assert m["calibration"] == pytest.approx(0.5)
    else:
        assert math.isnan(m["calibration"])
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"eval": m})
    log.close()
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["eval"]["ne"] is None


def test_no_rows():
    m = auc_logloss(np.empty(0), np.empty(0))
    assert m["rows"] == 0 and all(math.isnan(m[k]) for k in ("auc", "logloss", "ne",
                                                              "calibration"))
