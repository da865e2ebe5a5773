"""CPR's partial checkpoints (MFU, SSU), checkpoint chains, the data position and job
checkpoints: plain Python, no Ray."""

import json
import math

import numpy as np
import pytest
import torch

from cores import test_core, push
from recsync.checkpoint import files, job
from recsync.checkpoint.priority import MostUsed, SampledRows
from recsync.data.reader import Chunk
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import TableSpec
from recsync.worker.queue import ChunkQueue


def test_mfu_saves_the_most_used_rows_and_keeps_counting_the_others():
    mfu = MostUsed([10], fraction=0.5)
    for ids, times in (([1, 2], 5), ([3], 3), ([4], 1)):
        for _ in range(times):
            mfu.record(0, torch.tensor(ids), None)
    assert mfu.select()[0].tolist() == [1, 2]  # 4 rows used: the top half
    # rows 3 and 4 kept their counts; row 3 is now first, then 4 (ties: by index)
    mfu.record(0, torch.tensor([4]), None)
    assert mfu.select()[0].tolist() == [3]  # (counts 3 and 2: top half of 2 rows = 1)
    mfu.reset()
    assert mfu.select()[0].tolist() == []


def test_ssu_records_only_sampled_rows_within_its_bound():
    ssu = SampledRows(num_tables=2, max_rows=3)
    ssu.record(0, torch.tensor([5, 6, 7]), torch.tensor([True, False, True]))
    ssu.record(1, torch.tensor([1, 2]), torch.tensor([True, True]))  # room for one more
    ssu.record(0, torch.tensor([5]), torch.tensor([True]))  # already recorded: no room taken
    assert ssu.stats() == {"rows_recorded": 3, "rows_dropped": 1}
    assert [t.tolist() for t in ssu.select()] == [[5, 7], [1]]
    assert ssu.stats()["rows_recorded"] == 0  # a save empties it


def _core(priority=None, full_every=1):
    tables = [TableSpec("a", 40, 4), TableSpec("b", 40, 4)]
    return test_core(tables, make_row_optimizer("adagrad", 0.1), shard=0, num_shards=1,
                     num_workers=1, seed=0, priority=priority, full_every=full_every)


def _push(core, ids_a, ids_b):
    ids = [np.array(ids_a, np.int64), np.array(ids_b, np.int64)]
    grads = [np.ones((len(i), 4), np.float32) for i in ids]
    push(core, ids, grads, None, core.version)


def _rows(core, table, ids):
    return core.store.pull(table, torch.tensor(ids)).clone()


def test_a_chain_of_mfu_checkpoints_restores_the_saved_rows_and_the_base_for_the_rest():
    core = _core(MostUsed([40, 40], fraction=0.5), full_every=3)
    _push(core, [1, 2, 3], [4])
    assert not core.next_snapshot_partial()  # the first one is full
    base = core.snapshot()
    assert core.next_snapshot_partial()
    for _ in range(4):
        _push(core, [1], [4])  # rows a1 and b4 are used most
    _push(core, [2], [])  # a2 once
    partial = core.snapshot(partial=True)
    assert partial[1]["partial"] == "mfu"
    assert partial[0]["t0.local"].tolist() == [1] and partial[0]["t1.local"].tolist() == [4]
    assert core.next_snapshot_partial() is True and core.snapshots == 2
    expected = {"a1": _rows(core, 0, [1]), "b4": _rows(core, 1, [4])}
    a2_at_base = torch.from_numpy(base[0]["t0.weights"][base[0]["t0.local"].tolist().index(2)])
    restored = _core(MostUsed([40, 40], 0.5))
    restored.restore_chain([base, partial])
    assert torch.equal(_rows(restored, 0, [1]), expected["a1"])
    assert torch.equal(_rows(restored, 1, [4]), expected["b4"])
    assert torch.equal(_rows(restored, 0, [2])[0], a2_at_base)  # not saved since the base
    assert restored.version == core.version  # counters and version: the last one's
    with pytest.raises(ValueError, match="starts with a full"):
        restored.restore_chain([partial])


def _write(directory, sequence, base=None):
    meta = {} if base is None else {"base": base}
    files.write(directory, sequence, {"x": np.full(3, sequence, np.float32)}, meta)


def test_prune_keeps_what_the_newest_partial_checkpoints_need(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2, base=1)
    _write(tmp_path, 3, base=1)
    assert files.prune(tmp_path, keep=1) == []  # 3 needs 1 and 2
    assert [c.sequence for c in files.latest_chain(tmp_path)] == [1, 2, 3]
    _write(tmp_path, 4)
    files.prune(tmp_path, keep=1)
    assert [p.name for p in files.manifests(tmp_path)] == ["ckpt-000004.json"]
    _write(tmp_path, 5)
    _write(tmp_path, 6)
    files.prune(tmp_path, keep=1, keep_from=5)  # e.g. a job checkpoint names 5
    assert [p.name for p in files.manifests(tmp_path)] == ["ckpt-000006.json",
                                                           "ckpt-000005.json"]


def test_a_corrupt_partial_checkpoint_falls_back_to_the_chain_before_it(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2, base=1)
    _write(tmp_path, 3, base=1)
    data = tmp_path / "ckpt-000002.npz"
    data.write_bytes(data.read_bytes()[:-8] + b"garbage!")
    chain = files.latest_chain(tmp_path)
    assert [c.sequence for c in chain] == [1]  # 3 needs 2, which is corrupt
    assert any("ckpt-000002.npz: checksum mismatch" in s for s in chain[-1].skipped)


def _items(n):
    return [(0, Chunk("train", 0, 10 * k, 10 * (k + 1))) for k in range(n)]


def test_the_data_position_restores_leases_with_the_batches_already_trained():
    q = ChunkQueue(_items(4))
    a, b = q.take(0), q.take(1, slot=1)
    q.done(0, a)
    c = q.take(0)
    state = json.loads(json.dumps(q.state({(0, 0): 3, (1, 1): 1})))  # plain JSON
    q.done(0, c)  # after the checkpoint: rolled back below
    restored = ChunkQueue([])
    restored.restore(state)
    assert restored.summary()["completed"] == 1 and restored.summary()["pending"] == 3
    taken = [restored.take_with_skip(0), restored.take_with_skip(1),
             restored.take_with_skip(0, slot=1)]
    # the leases first, in (worker, slot) order, with their skips; then the pending ones
    assert taken == [(c, 3), (b, 1), (_items(4)[3], 0)]
    for w, slot, (item, _) in ((0, 0, taken[0]), (1, 0, taken[1]), (0, 1, taken[2])):
        restored.done(w, item, slot)
    assert restored.take(0) is None
    assert restored.summary()["completed_more_than_once"] == 0
    assert restored.summary()["completed"] == 4


def test_restorable_passes_over_a_job_checkpoint_whose_shard_checkpoint_is_missing(tmp_path):
    for seq in (1, 2):
        _write(job.shard_dir(tmp_path, 0), seq)
    for seq, shard_seq in ((1, 1), (2, 3)):  # job 2 names shard checkpoint 3: never written
        files.write(job.job_dir(tmp_path), seq, {}, {"shard_sequences": [shard_seq]})
    ckpt, skipped = job.restorable(tmp_path)
    assert ckpt.sequence == 1
    assert len(skipped) == 1 and "shard-0/ckpt-000003.json: no such checkpoint" in skipped[0]


def test_dense_state_round_trips_through_a_job_checkpoint(tmp_path):
    params = torch.randn(6)
    opt = torch.optim.Adagrad([torch.nn.Parameter(params.clone())], lr=0.1)
    opt.param_groups[0]["params"][0].grad = torch.ones(6)
    opt.step()
    state = {"params": params.numpy(), "optimizer": opt.state_dict()}
    files.write(tmp_path, 1, job.dense_arrays(state),
                {"dense_param_groups": job.dense_meta(state)})
    back = job.dense_state(files.load(files.manifest_path(tmp_path, 1)))
    assert np.array_equal(back["params"], params.numpy())
    fresh = torch.optim.Adagrad([torch.nn.Parameter(params.clone())], lr=0.1)
    fresh.load_state_dict(back["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["sum"], opt.state_dict()["state"][0]["sum"])


def test_the_ps_client_marks_exactly_the_rows_of_the_sampled_samples():
    from recsync.embedding.lookup import LookupPlan
    from recsync.embedding.spec import TableSpec
    from recsync.ps.client import PSClient
    sparse = torch.tensor([[1, 7], [2, 7], [1, 8], [3, 9]])  # 4 samples, 2 tables
    plan = LookupPlan.single_hot([TableSpec("a", 10, 2), TableSpec("b", 10, 2)])
    tables = plan.dedup(sparse)
    ids = [u for u, _ in tables]
    pulled = plan.fuse(sparse, tables, [torch.zeros(len(u), 2) for u in ids])
    assert PSClient([], [2, 2])._sampled(pulled) is None  # SSU off
    every = PSClient([], [2, 2], ssu_rate=1.0)._sampled(pulled)
    assert [m.tolist() for m in every] == [[True] * 3, [True] * 3]
    client = PSClient([], [2, 2], ssu_rate=0.5, seed=1)
    keep = np.random.default_rng(1).random(4) < 0.5  # the same draw the client makes
    masks = client._sampled(pulled)
    for t, m in enumerate(masks):
        expected = {int(i) for i in sparse[torch.from_numpy(keep), t]}
        assert {int(i) for i in ids[t][m]} == expected


@pytest.mark.parametrize("seed, high", [(0, 3), (1, 50), (2, 10**6)])
def test_mfu_picks_what_a_stable_sort_by_count_picks_ties_by_index(seed, high):
    """Many equal counts (high 3): the rows at the k-th largest count are taken lowest index
    first, as a stable descending sort would."""
    gen = torch.Generator().manual_seed(seed)
    mfu = MostUsed([5000, 777], 0.1)
    for c in mfu.counts:
        c.copy_(torch.randint(0, high, c.shape, generator=gen).to(c.dtype))
    expected = []
    for c in mfu.counts:
        used = c.nonzero().squeeze(1)
        k = math.ceil(0.1 * len(used))
        order = torch.sort(c[used], descending=True, stable=True).indices[:k]
        expected.append(used[order].sort().values)
    for got, want in zip(mfu.select(), expected):
        assert torch.equal(got, want)


def test_a_frozen_choice_is_what_select_would_have_chosen_and_restart_forgets_it():
    mfu = MostUsed([10], fraction=0.5)
    for ids, times in (([1, 2], 5), ([3], 3), ([4], 1)):
        for _ in range(times):
            mfu.record(0, torch.tensor(ids), None)
    choose = mfu.freeze()
    mfu.record(0, torch.tensor([4]), None)  # counted after the freeze: not in the choice
    mfu.record(0, torch.tensor([4]), None)
    mfu.record(0, torch.tensor([4, 2]), None)  # 2: pushed while the chosen rows are copied
    rows = choose()
    assert rows[0].tolist() == [1, 2]
    mfu.restart(rows)
    assert mfu.counts[0].tolist() == [0, 0, 1, 3, 4, 0, 0, 0, 0, 0]  # 2's push after the freeze
    ssu = SampledRows(1, max_rows=10)
    ssu.record(0, torch.tensor([5, 6]), torch.tensor([True, False]))
    choose = ssu.freeze()
    ssu.record(0, torch.tensor([7]), torch.tensor([True]))  # recorded for the next one
    assert choose()[0].tolist() == [5] and ssu.select()[0].tolist() == [7]
