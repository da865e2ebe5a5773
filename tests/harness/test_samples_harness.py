"""Every real sample in ../shared/data converts with a shipped preset and trains end to end in
local, sync and gba (2 workers). Skipped where the shared samples are absent.
Run: pytest -q tests/harness/test_samples_harness.py"""

from __future__ import annotations

import pytest

import recsync
from recsync.bench.quality import shared_data_dir
from recsync.data.reader import Dataset
from recsync.run.driver import run
from harness_config import config

SHARED = shared_data_dir()
SAMPLES = {  # sample folder -> (input files, preset)
    "criteo_sample_deepctr": (["criteo_sample.txt"], "criteo_csv"),
    "criteo_raw_paddlerec": (["sample_train.txt"], "criteo"),
    "criteo_kaggle_train_head1k": (["train_head1k.txt"], "criteo"),
    "avazu_head9k": (["avazu_train_head9k.csv"], "avazu"),
    "avazu_sample_deepctr": (["avazu_sample.txt"], "avazu"),
    "movielens_sample_deepctr": (["movielens_sample.txt"], "movielens"),
    "taobao_tiny_fuxictr": (["train_sample.csv", "valid_sample.csv"], "taobao"),
}
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"no shared samples at {SHARED}")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each sample converted once, with its preset."""
    root = tmp_path_factory.mktemp("samples")
    out = {}
    for name, (files, preset) in SAMPLES.items():
        recsync.convert([SHARED / name / f for f in files], root / name, preset=preset,
                        progress=False)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("mode", ["local", "sync", "gba"])
def test_sample_trains_end_to_end(name, mode, converted, fake_ray, tmp_path):
    extra = [] if mode == "local" else ["cluster.workers=2", "cluster.ps_shards=1"]
    cfg = config(converted[name], f'mode="{mode}"', "train.batch_size=128", *extra)
    summary = run(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary.get("error")
    ds = Dataset(converted[name])
    assert summary["samples"] == ds.rows("train")  # every training row once
    assert summary["eval"]["rows"] == ds.rows("eval") > 0
