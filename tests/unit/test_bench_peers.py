"""Scenario `peers` assembled with fake runs (no Ray, no training, no TorchRec): the ratios the
issue's checks read, the skip where TorchRec is missing, and the order of TorchRec's dot
products. Run: pytest -q tests/unit/test_bench_peers.py"""

import sys

import pytest
import torch

from recsync.bench import SEEDED, run_scenario
from recsync.bench import overhead as ov
from recsync.bench import peers
from recsync.bench import peers_torchrec as pt
from recsync.model.compute import resolve_precision

SPEED = {"local": 30_000.0, "async_1w1s": 27_000.0, "local_no_row_decay": 30_000.0,
         "torchrec": 24_000.0}
RATIOS = ("local_vs_torchrec_speed", "local_minus_torchrec_auc", "async_1w_vs_local_speed",
          "local_no_row_decay_minus_torchrec_auc")


def _summary(name: str, seed: int) -> dict:
    return {"mode": name, "samples": 100_000, "samples_per_s": SPEED[name] + 100 * seed,
            "summary_samples_per_s": SPEED[name], "threads": 1, "dense_warmup_steps": 14,
            "row_weight_decay_applied": False,
            "versions": {"torchrec": "1.8.0", "fbgemm_gpu": "1.8.0"},
            "eval": {"auc": 0.80 + 0.001 * seed + (0.002 if name == "local" else 0.0),
                     "logloss": 0.45, "rows": 1000, "bayes_auc": 0.81}}


@pytest.fixture
def calls(monkeypatch):
    """Fake arms: the order they ran in, as (arm, seed)."""
    done = []

    def recsync_arm(cfg, out_dir, name):
        done.append((name, cfg.train.seed))
        return _summary(name, cfg.train.seed)

    def torchrec_arm(cfg, ds, out_dir, warmup_steps):
        done.append(("torchrec", cfg.train.seed))
        return _summary("torchrec", cfg.train.seed)

    monkeypatch.setattr(ov, "run_arm", recsync_arm)
    monkeypatch.setattr(ov, "make_data", lambda path, rows, table_rows, eval_rows: path)
    monkeypatch.setattr(peers, "Dataset", lambda path: None)
    monkeypatch.setattr(pt, "run_arm", torchrec_arm)
    return done


def test_peers_is_seeded_with_three_seeds_by_default(calls, monkeypatch, tmp_path):
    monkeypatch.setattr(pt, "missing", lambda: None)
    r = run_scenario("peers", tmp_path)
    assert "peers" in SEEDED and r["seeds"] == 3
    assert calls == [(arm, s) for s in range(3)
                     for arm in ("local", "async_1w1s", "local_no_row_decay", "torchrec")]


def test_the_ratios_are_ratios_of_the_means_over_seeds(calls, monkeypatch, tmp_path):
    monkeypatch.setattr(pt, "missing", lambda: None)
    r = run_scenario("peers", tmp_path, seeds=2)
    ratios = r["ratios"]
    assert set(ratios) == set(RATIOS)
    assert ratios["local_vs_torchrec_speed"] == pytest.approx(30_050 / 24_050)
    assert ratios["async_1w_vs_local_speed"] == pytest.approx(27_050 / 30_050)
    assert ratios["local_minus_torchrec_auc"] == pytest.approx(0.002)
    assert ratios["local_no_row_decay_minus_torchrec_auc"] == pytest.approx(0.0)
    assert r["differences"]["local_minus_torchrec_auc"]["n"] == 2
    report = (tmp_path / "report.md").read_text()
    assert "samples/s (mean)" in report and "NOT applied" in report
    assert ("| local: options | train.threads = 1, train.dense_precision = auto, "
            "train.compile = False |") in report  # the options about threads, precision, compile
    used = resolve_precision("auto", torch.device("cpu"))[0]  # bfloat16 on a CPU with AMX
    assert f"the dense training steps ran in {used} here" in report


def test_without_torchrec_its_arm_is_skipped_with_one_line_and_its_ratios_are_none(
        calls, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pt, "missing", lambda: "ModuleNotFoundError: No module named 'torchrec'")
    r = run_scenario("peers", tmp_path, seeds=1)
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "TorchRec is not installed" in line] == [
        line for line in out.splitlines() if line.startswith("peers: TorchRec")]
    assert "scripts/install_peers.sh" in out
    assert calls == [("local", 0), ("async_1w1s", 0)]
    assert set(r["arms"]) == {"local", "async_1w1s"} and r["skipped"]["torchrec"]
    assert r["ratios"]["local_vs_torchrec_speed"] is None
    assert r["ratios"]["local_minus_torchrec_auc"] is None
    assert r["ratios"]["local_no_row_decay_minus_torchrec_auc"] is None
    assert r["ratios"]["async_1w_vs_local_speed"] == pytest.approx(27_000 / 30_000)
    assert "TorchRec is not installed" in (tmp_path / "report.md").read_text()


def test_missing_names_the_import_that_failed(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrec", None)  # an import of it raises ImportError
    assert "torchrec" in pt.missing()


def test_torchrecs_dot_products_map_onto_recsyncs_pairs():
    vectors = torch.randn(3, 5, 4)  # [B, vectors, dim]
    dots = vectors @ vectors.transpose(1, 2)
    lower = torch.tril_indices(5, 5, offset=-1)  # recsync's DLRM
    upper = torch.triu_indices(5, 5, offset=1)  # TorchRec's InteractionArch
    ours, theirs = dots[:, lower[0], lower[1]], dots[:, upper[0], upper[1]]
    assert torch.equal(ours[:, pt.pair_order(5)], theirs)
    assert pt.pair_order(4).tolist() == [0, 1, 3, 2, 4, 5]
