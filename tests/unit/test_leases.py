"""A worker's leases (worker/leases.py) without Ray: chunks read as batches from the row
reached, at the batch size of the moment, and an elastic group's member asking the queue
again after finding it empty."""

import pytest
import ray

from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.worker.leases import Leases
from recsync.worker.queue import ChunkQueue


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    generate(root, rows=512, eval_rows=64, spec=SynthSpec(seed=5, max_table_rows=40),
             processes=1, progress=False)
    return root


class _Remote:
    def __init__(self, fn):
        self.remote = fn


class _Queue:
    """ChunkQueue behind the `.remote` calls Leases makes (ray.get is the identity here)."""

    def __init__(self, items):
        self.q = ChunkQueue(items)
        self.take_with_skip = _Remote(self.q.take_with_skip)
        self.done = _Remote(self.q.done)


def _leases(monkeypatch, ds, queue, keep_asking, size=lambda: 40):
    monkeypatch.setattr(ray, "get", lambda x, **_: x)
    from recsync.config import load_config
    cfg = load_config(None, ['mode="sync"', "data.shuffle=false"])
    return Leases(0, queue, ds, cfg, size, lambda: False, keep_asking=keep_asking)


def test_a_group_member_finding_the_queue_empty_steps_without_a_batch_and_asks_again(
        monkeypatch, tiny):
    """A leaver of an elastic sync group may hand a chunk back after the others found the
    queue empty: they must take it at a later step, not stop asking (the group stops when
    no member has a batch)."""
    ds = Dataset(tiny)
    chunk = ds.chunks("train", 100)[0]
    queue = _Queue([])
    leases = _leases(monkeypatch, ds, queue, keep_asking=True)
    feed = leases.batches((0,))
    assert next(feed) == (None, None) and next(feed) == (None, None)
    queue.q.pending.append((0, chunk))  # handed back by a leaver, 60 rows trained
    queue.q.skip[(0, chunk)] = 60
    batch, finished = next(feed)
    assert len(batch) == 40 and finished == ((0, chunk), 0)  # the chunk's last 40 rows
    assert leases.position[0] == 100


def test_a_worker_of_a_fixed_run_stops_at_an_empty_queue(monkeypatch, tiny):
    ds = Dataset(tiny)
    leases = _leases(monkeypatch, ds, _Queue([]), keep_asking=False)
    assert list(leases.batches((0,))) == []


def test_the_rows_handed_out_follow_a_batch_size_that_changes(monkeypatch, tiny):
    ds = Dataset(tiny)
    chunk = ds.chunks("train", 100)[0]
    sizes = iter([30, 30, 50])
    leases = _leases(monkeypatch, ds, _Queue([(0, chunk)]), keep_asking=False,
                     size=lambda: next(sizes))
    got = []
    for batch, finished in leases.batches((0,)):
        got.append((len(batch), finished))
        if finished is not None:  # reported done after its step, as the worker does
            leases.done(*finished)
    assert got == [(30, None), (30, None), (40, ((0, chunk), 0))]
