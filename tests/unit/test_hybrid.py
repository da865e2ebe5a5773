"""Mode hybrid without Ray: the shard's bounded step barrier (steps ahead are kept and applied in
order, each contribution's staleness is the steps its rows missed) and how far a worker's pull
waits."""

from __future__ import annotations

import numpy as np
import pytest

from recsync.config import RunConfig
from recsync.embedding.row_optim import RowSGD
from recsync.embedding.spec import TableSpec
from recsync.modes import MODES
from recsync.modes.base import REBUILD_GROUP, WorkerContext
from recsync.modes.hybrid import BoundedBarrier, HybridWorker
from recsync.ps.core import ShardCore

TABLES = [TableSpec("a", 8, 2)]


def core(workers=2, ahead=2) -> ShardCore:
    return ShardCore(TABLES, RowSGD(lr=0.5), shard=0, num_shards=1,
                     rule=BoundedBarrier(workers, ahead), mode="hybrid")


def push(c, step, row, value, samples=1, version_read=None):
    ids = [np.array([row], np.int64)] if samples else [np.empty(0, np.int64)]
    grads = [np.full((len(ids[0]), 2), value * samples, np.float32)]
    meta = {"step": step, "samples": samples,
            "version_read": step if version_read is None else version_read}
    return c.push(ids, grads, None, meta)


def test_steps_ahead_are_kept_until_the_steps_before_them_are_applied():
    c = core()
    row0 = c.pull([np.array([3])])[0][0].copy()
    assert push(c, 1, 3, 1.0, version_read=0) is False  # worker 0 ran one step ahead
    assert push(c, 1, 3, 1.0, version_read=0) is False  # so did worker 1: step 1 complete,
    assert c.version == 0                                # but step 0 is not
    assert push(c, 0, 3, 2.0) is False
    assert push(c, 0, 3, 2.0) is True  # step 0 completes, and step 1 right after it
    assert c.version == 2
    np.testing.assert_allclose(c.pull([np.array([3])])[0][0], row0 - 0.5 * 2.0 - 0.5 * 1.0)
    assert c.staleness == {0: 2, 1: 2}  # step 1's rows were read before step 0 was applied


def test_a_push_beyond_the_bound_or_behind_the_shard_is_refused():
    c = core(ahead=1)
    with pytest.raises(ValueError, match="at most 1 ahead"):
        push(c, 2, 3, 1.0)
    push(c, 0, 3, 1.0)
    push(c, 0, 3, 1.0)
    with pytest.raises(ValueError, match="step 0"):
        push(c, 0, 3, 1.0)


def test_an_empty_push_counts_its_worker_and_no_staleness():
    c = core()
    push(c, 0, 3, 1.0)
    assert push(c, 0, 3, 1.0, samples=0, version_read=0) is True
    assert c.staleness == {0: 2}


def test_pulls_wait_for_the_step_max_staleness_before_and_the_replica_keeps_as_many_states():
    for staleness in (0, 2):
        cfg = RunConfig(mode="hybrid", hybrid={"max_staleness": staleness})
        import torch
        model = torch.nn.Linear(2, 1)
        w = HybridWorker(WorkerContext(rank=0, cfg=cfg, model=model, client=None,
                                       new_client=lambda: None, shards=[], step_index=5))
        assert w.min_version() == 5 - staleness
        assert w.before.maxlen == staleness + 1


def test_hybrid_has_syncs_driver_facts():
    hybrid, sync = MODES["hybrid"], MODES["sync"]
    assert hybrid.lockstep and hybrid.pauses_for_checkpoint and not hybrid.dense_on_ps
    assert hybrid.worker_death == REBUILD_GROUP == sync.worker_death
    assert hybrid.needs_group(RunConfig(mode="hybrid"))
