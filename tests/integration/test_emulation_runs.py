"""The EMULATED cluster end to end: workers and shards paced on their emulated cores, a
straggler paced at its factor, the figures and the label in summary.json (docs/design.md §6b).

The bound asserted is the one pacing guarantees whatever the machine's load: no paced section
ends before its emulated time (a loaded machine can only make it later)."""

import pytest

from recsync.data.reader import Dataset
from recsync.metrics.core import read_jsonl
from recsync.run.driver import run
from runs import config

EMULATION = ["emulation.cores_per_worker=0.25", "emulation.cores_per_shard=0.25"]


@pytest.mark.parametrize("mode", ["sync", "shadow"])
def test_an_emulated_cluster_paces_each_process_and_its_straggler(ray_cluster, data, tmp_path,
                                                                   mode):
    # shadow: its shadow thread on cores of its own
    shadow = ["emulation.cores_per_shadow=0.25"] if mode == "shadow" else []
    cfg = config(data, f'mode="{mode}"', "cluster.workers=2", "cluster.ps_shards=1",
                 "shadow.hogwild_threads=2", "train.max_steps=12", *EMULATION, *shadow,
                 "faults.stragglers=[{ worker = 0, factor = 3.0 }]")
    summary = run(cfg, tmp_path)
    assert summary["status"] == "completed"
    em = summary["emulation"]
    assert em["label"] == ("EMULATED cluster: 2 workers x 0.25 cores"
                           + (" (+ 0.25 for the shadow thread)" if shadow else "")
                           + ", 1 shards x 0.25 cores")
    straggler, other = em["workers"]
    steps = [w["steps"] for w in summary["per_worker"]]
    assert [straggler["steps"], other["steps"]] == steps and min(steps) > 0
    assert straggler["expected"] == pytest.approx(3 / 0.25)
    assert other["expected"] == pytest.approx(1 / 0.25)
    for w in em["workers"]:
        assert w["compute_wall_per_cpu"] >= 0.99 * w["expected"]
        assert w["slept_s"] > 0  # the machine is faster than 0.25 cores: pacing slept
        if shadow:  # every round paced on the shadow thread's cores (a straggler's: slower)
            rounds = w["shadow_thread"]
            assert rounds["rounds"] > 0 and rounds["wall_per_cpu"] >= 0.99 / 0.25
    (shard,) = em["shards"]
    assert shard["requests"] > 0 and shard["wall_per_cpu"] >= 0.99 * shard["expected"]
    assert summary["samples"] <= Dataset(data).rows("train")
    # a poll sees each step's compute time with the step, however long the step (what the
    # mode controller compares); a step's compute once fell in the poll before its end
    polls = [r["worker_compute_s"] for r in read_jsonl(tmp_path / "metrics.jsonl")
             if "worker_compute_s" in r]
    assert polls and all(c is None or c > 0 for p in polls for c in p)

