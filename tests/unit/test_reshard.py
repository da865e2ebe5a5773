"""Resharding a job checkpoint (checkpoint/reshard.py) and what a resumed run may change
(checkpoint/resume_config.py): plain Python, no Ray."""

import numpy as np
import pytest
import torch

from cores import push, test_core
from recsync.checkpoint.priority import MostUsed
from recsync.checkpoint.reshard import fold_counts, fold_queue, resolve_chain, snapshot_for
from recsync.checkpoint.resume_config import check_resume_config
from recsync.config import RunConfig
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.spec import TableSpec
from recsync.ps.core import DenseState

TABLES = [TableSpec("a", 50, 4), TableSpec("b", 31, 4)]


def _cores(num_shards, center=None, priority=None, full_every=1):
    cores = []
    for s in range(num_shards):
        dense = (DenseState(torch.zeros(6), "adagrad", 0.1) if s == 0 and center is None
                 else None)
        cores.append(test_core(TABLES, make_row_optimizer("adagrad", 0.1), shard=s,
                               num_shards=num_shards, seed=1, dense=dense,
                               center=center if s == 0 else None,
                               mode="async" if center is None or s else "easgd",
                               priority=priority and priority(), full_every=full_every))
    return cores


def _train(cores, steps=5, seed=0):
    """Pushes of random rows (each to its owner) and dense gradients to shard 0."""
    rng = np.random.default_rng(seed)
    n = len(cores)
    for _ in range(steps):
        ids = [np.unique(rng.integers(0, t.rows, 12)) for t in TABLES]
        for s, core in enumerate(cores):
            mine = [i[i % n == s] for i in ids]
            grads = [rng.normal(size=(len(i), 4)).astype(np.float32) for i in mine]
            dense = rng.normal(size=6).astype(np.float32) if core.dense is not None else None
            push(core, mine, grads, dense, core.version)


def _by_id(snapshots):
    """{(table, global id): (row, state)} of snapshots of shards 0..S-1."""
    out = {}
    for s, (arrays, meta) in enumerate(snapshots):
        assert meta["num_shards"] == len(snapshots) and meta["shard"] == s
        for t in range(len(TABLES)):
            for i, local in enumerate(arrays[f"t{t}.local"]):
                key = (t, int(local) * len(snapshots) + s)
                assert key not in out
                out[key] = (arrays[f"t{t}.weights"][i], arrays[f"t{t}.state"][i])
    return out


def _reshard(snapshots, new_shards, center=None):
    fresh = _cores(new_shards, center)
    for n, core in enumerate(fresh):
        core.restore(*snapshot_for(iter(snapshots), len(snapshots), n, new_shards,
                                   core.rule.snapshot(), core.mode))
    return fresh


@pytest.mark.parametrize("old,new", [(2, 3), (2, 1), (3, 2), (1, 4)])
def test_rows_and_their_state_go_to_the_new_shards_by_global_id(old, new):
    cores = _cores(old)
    _train(cores)
    saved = [c.snapshot() for c in cores]
    resharded = _reshard(saved, new)
    before, after = _by_id(saved), _by_id([c.snapshot() for c in resharded])
    assert sorted(before) == sorted(after) and len(before) > 20
    for key, (row, state) in before.items():
        np.testing.assert_array_equal(after[key][0], row, err_msg=str(key))
        np.testing.assert_array_equal(after[key][1], state, err_msg=str(key))
    # the dense parameters and their optimizer state: shard 0's, on new shard 0 only
    assert torch.equal(resharded[0].dense.params, cores[0].dense.params)
    assert torch.equal(resharded[0].dense.optimizer.state_dict()["state"][0]["sum"],
                       cores[0].dense.optimizer.state_dict()["state"][0]["sum"])
    assert all(c.dense is None for c in resharded[1:])
    # every version is the highest old one; the pushes' total is kept
    assert {c.version for c in resharded} == {max(c.version for c in cores)}
    assert sum(c.pushes for c in resharded) == sum(c.pushes for c in cores)
    # the new shards pull exactly the old rows
    ids = torch.tensor(sorted(i for t, i in before if t == 0))
    old_rows = torch.stack([cores[int(i) % old].store.pull(0, i[None])[0] for i in ids])
    new_rows = torch.stack([resharded[int(i) % new].store.pull(0, i[None])[0] for i in ids])
    assert torch.equal(old_rows, new_rows)


def test_the_mode_rule_state_stays_with_its_shard_index():
    center = np.arange(6, dtype=np.float32)
    cores = _cores(2, center=center)
    cores[0].rule.exchange(cores[0], np.ones(6, np.float32), 0.5)  # EASGD's center moves
    _train(cores)
    resharded = _reshard([c.snapshot() for c in cores], 3, center=np.zeros(6, np.float32))
    assert torch.equal(resharded[0].rule.center, cores[0].rule.center)
    assert resharded[0].rule.pushes == 1


def test_a_partial_chain_is_resolved_to_what_restoring_it_gives():
    cores = _cores(1, priority=lambda: MostUsed([50, 31], 0.5), full_every=3)
    _train(cores, steps=3)
    base = cores[0].snapshot()
    _train(cores, steps=4, seed=1)
    partial = cores[0].snapshot(partial=True)
    assert partial[1]["partial"] == "mfu" and 0 < partial[1]["rows"] < base[1]["rows"] + 20
    restored = _cores(1)[0]
    restored.restore_chain([base, partial])
    arrays, meta = resolve_chain([base, partial])
    assert meta["partial"] is None
    expected = restored.snapshot()[0]
    for t in range(len(TABLES)):
        for part in ("local", "weights", "state"):
            np.testing.assert_array_equal(arrays[f"t{t}.{part}"], expected[f"t{t}.{part}"])


def test_a_snapshot_of_another_layout_is_refused():
    snapshot = _cores(2)[1].snapshot()
    with pytest.raises(ValueError, match="shard 1 of 2, this is shard 0 of 3"):
        _cores(3)[0].restore(*snapshot)


def test_counts_of_ranks_that_no_longer_exist_are_folded_in():
    done = [{"samples": 10, "steps": 2}, {"samples": 20, "steps": 3},
            {"samples": 5, "steps": 1}]
    assert fold_counts(done, 2) == [{"samples": 15, "steps": 2}, {"samples": 20, "steps": 3}]
    assert fold_counts(done, 4)[3] == {"samples": 0, "steps": 0}
    state = {"pending": [], "leased": [], "completed": [],
             "by_worker": {"0": {"chunks": 1, "samples": 10},
                           "2": {"chunks": 2, "samples": 5}}}
    assert fold_queue(state, 1)["by_worker"] == {"0": {"chunks": 3, "samples": 15}}


def test_a_resumed_run_may_change_where_it_runs_not_what_it_trains():
    saved = RunConfig(mode="gba").model_dump(mode="json")
    now = RunConfig(mode="gba", cluster={"ps_shards": 3, "workers": 4},
                    output={"plot": False}).model_dump(mode="json")
    assert check_resume_config(saved, now, "run/config.toml") == [
        "cluster.ps_shards: 1 -> 3", "cluster.workers: 1 -> 4", "output.plot: true -> false"]
    for changed, key in ((RunConfig(mode="gba", model={"embedding_dim": 8}),
                          "model.embedding_dim"),
                         (RunConfig(mode="gba", data={"path": "other"}), "data.path"),
                         (RunConfig(mode="async"), "mode")):
        with pytest.raises(ValueError, match=f"run/config.toml: {key} = .* but the "
                                             "checkpointed run had") as e:
            check_resume_config(saved, changed.model_dump(mode="json"), "run/config.toml")
        assert "\n" not in str(e.value)


def test_resume_point_names_what_changes_and_refuses_a_model_change(tmp_path):
    from recsync.checkpoint import files, job
    from recsync.run.driver import resume_point
    cfg = RunConfig(mode="gba", cluster={"ps_shards": 2}, recovery={"checkpoint_every_s": 1.0})
    root = tmp_path / "checkpoints"
    for shard in range(2):
        files.write(job.shard_dir(root, shard), 1, {"x": np.zeros(1, np.float32)}, {})
    files.write(job.job_dir(root), 1, {}, {"final": False, "shard_sequences": [1, 1],
                                           "config": cfg.model_dump(mode="json")})
    resumed = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"ps_shards": 3})})
    assert resume_point(resumed, tmp_path).changes == ["cluster.ps_shards: 2 -> 3"]
    changed = cfg.model_copy(update={"model": cfg.model.model_copy(
        update={"embedding_dim": 8})})
    with pytest.raises(ValueError, match="config.toml: model.embedding_dim = 8 but the "
                                         "checkpointed run had 16"):
        resume_point(changed, tmp_path)
