"""On the runtime harness: a distributed run that ends without finishing because of its model
(NaN loss in a worker) fails in one line, writes its summary and leaves no actor behind. (The
signals and a disk that fills mid-run, on Ray, with the processes they must leave none of:
tests/integration/test_endings.py.)

Run: pytest -q tests/harness/test_endings_harness.py
"""

import json

import pytest

from harness_config import config
from recsync.distributed.errors import RunFailed
from recsync.run.driver import run


def test_a_diverging_model_stops_the_run_at_that_step_with_its_summary(fake_ray, data,
                                                                      tmp_path):
    cfg = config(data, 'mode="sync"', "cluster.workers=2", "train.dense_lr=1e30",
                 "train.embedding_lr=1e30")
    with pytest.raises(RunFailed, match=r"loss is (nan|inf) at step \d+ of worker \d in mode "
                                        r"'sync'") as failed:
        run(cfg, tmp_path)
    assert "\n" not in str(failed.value)  # one line, no traceback
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "loss is" in summary["error"]
    # nothing of the failed run lives on in the session (the traceback holds its handles)
    assert [a.name for a in fake_ray.actors() if a.inc is not None] == []
