"""output.tensorboard: event files in OUT/tb/ read back with tensorboard's own reader hold
metrics.jsonl's figures at its steps (training samples); without the package the run is
refused before it starts."""

from __future__ import annotations

import importlib.util
import json

import pytest

from recsync.config import load_config
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.core import MetricsLog, read_jsonl
from recsync.run.driver import run

BATCH = 50


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=600, eval_rows=200, spec=SynthSpec(seed=4, max_table_rows=100),
             processes=1, progress=False)
    return root


def config(data, *extra):
    return load_config(None, [
        f"data.path={json.dumps(str(data))}", "model.embedding_dim=4", "model.bottom_mlp=[8]",
        "model.top_mlp=[8]", f"train.batch_size={BATCH}", "output.progress=false",
        "output.plot=false", "output.log_every_steps=3", *extra])


def _scalars(tb_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_event_files_hold_the_metrics_at_their_steps(data, tmp_path):
    pytest.importorskip("tensorboard")
    summary = run(config(data, "output.tensorboard=true"), tmp_path)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    scalars = _scalars(tmp_path / "tb")
    loss = [(r["samples"], r["loss"]) for r in records]
    assert [s for s, _ in scalars["train/loss"]] == [s for s, _ in loss]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([v for _, v in loss])
    evals = [r["eval"] for r in records if r["eval"]]
    assert len(evals) == 8
    for key in ("auc", "logloss", "ne", "calibration"):
        assert scalars[f"eval/{key}"] == [(e["samples"], pytest.approx(e[key])) for e in evals]
        assert scalars[f"final/{key}"] == [(summary["samples"],
                                            pytest.approx(summary["eval"][key]))]
    assert [s for s, _ in scalars["train/samples_per_s"]] == [s for s, _ in loss]
    assert {v for _, v in scalars["train/mode"]} == {0.0}  # "local"


def test_events_and_staleness_and_mode_changes(tmp_path):
    """What only distributed runs write (staleness, switches, checkpoints, recoveries)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    log = MetricsLog(tmp_path / "metrics.jsonl", tmp_path / "tb")
    base = {"time_s": 1.0, "loss": 0.5, "samples_per_s": 100.0, "eval": None}
    log.write({**base, "samples": 100, "mode": "sync", "staleness": None, "events": []})
    log.write({**base, "samples": 200, "mode": "gba", "staleness": {"mean": 1.5, "max": 4},
               "events": [{"time_s": 1.0, "event": "switched sync -> gba"},
                          {"time_s": 1.2, "event": "checkpoint: shards' sequence numbers [1]"},
                          {"time_s": 1.4, "event": "partial recovery: shard 0 restarted"}]})
    log.final_eval({"auc": 0.7, "logloss": 0.5, "ne": None, "calibration": 1.1}, 200)
    log.close()
    scalars = _scalars(tmp_path / "tb")
    assert scalars["train/staleness_mean"] == [(200, 1.5)]
    assert scalars["train/staleness_max"] == [(200, 4.0)]
    assert scalars["train/mode"] == [(100, 1.0), (200, 3.0)]  # MODE_NAMES: local, sync, async, gba
    assert scalars["events/checkpoints"] == [(200, 1.0)]
    assert scalars["events/recoveries"] == [(200, 1.0)]
    assert "final/ne" not in scalars and scalars["final/calibration"] == [(200,
                                                                          pytest.approx(1.1))]
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = {tag: [e.step for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
    assert any(tag.startswith("mode") and steps == [100, 200] for tag, steps in texts.items())
    assert any(tag.startswith("events") and steps == [200, 200, 200]
               for tag, steps in texts.items())


def test_refused_before_it_starts_without_tensorboard(data, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match=r"output.tensorboard = true .*pip install "
                                         r"'recsync\[tensorboard\]'"):
        run(config(data, "output.tensorboard=true"), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written
