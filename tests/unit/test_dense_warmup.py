"""train.dense_warmup_steps: the k-th dense update uses lr x min(1, (k+1)/W), on every dense
optimizer (local run, sync/hybrid replicas, PS shard 0, shadow replicas), and the count goes
on where the optimizer state goes (switching both ways, shard snapshots, OUT/model)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

import recsync.modes.sync as sync_mod
from cores import push, test_core
from fake_ps import fake_shards, patch_ray_get
from recsync.config import ModelConfig, RunConfig, TrainConfig
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.embedding.row_optim import RowSGD
from recsync.embedding.spec import TableSpec
from recsync.model.optim import (UPDATES, dense_step, dense_updates, make_dense_optimizer,
                                 warmup_factor)
from recsync.model.setup import model_for
from recsync.modes.base import WorkerContext
from recsync.modes.shadow import ShadowWorker
from recsync.modes.sync import SyncWorker
from recsync.ps.build import make_core
from recsync.ps.client import PSClient
from recsync.ps.core import DenseState
from recsync.run.local_run import build_local_model, train_step
from recsync.run.warm_start import flat_optimizer_state

LR, W = 0.1, 4


def test_the_factor_ramps_linearly_to_one():
    assert [warmup_factor(k, 4) for k in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == warmup_factor(0, 1) == 1.0
    with pytest.raises(ValueError):
        TrainConfig(dense_warmup_steps=-2)


@pytest.mark.parametrize("configured, rows, workers, max_steps, used", [
    (-1, 4_096_000, 1, 0, 100),  # 1000 steps: the full 100
    (-1, 7_168, 1, 0, 2),  # the Avazu sample at batch 256: 28 steps, a tenth
    (-1, 4_096_000, 4, 0, 25),  # 250 steps per worker
    (-1, 4_096_000, 1, 300, 30),  # max_steps bounds the run
    (0, 7_168, 1, 0, 0), (500, 7_168, 1, 0, 500)])  # configured: as is
def test_the_default_warmup_is_100_steps_at_most_a_tenth_of_the_run(configured, rows, workers,
                                                                    max_steps, used):
    t = TrainConfig(dense_warmup_steps=configured, batch_size=256 if rows < 10_000 else 4096,
                    max_steps=max_steps)
    assert t.warmup_for(rows, workers) == used


def _sgd_steps(opt, p, steps):
    moves = []
    for _ in range(steps):
        before = p.detach().clone()
        p.grad = torch.ones_like(p)
        dense_step(opt, W)
        moves.append(float((before - p.detach())[0]))
    return moves


def test_dense_step_uses_lr_over_w_first_and_lr_after_w_updates():
    p = torch.zeros(3, requires_grad=True)
    opt = make_dense_optimizer("sgd", [p], LR)
    moves = _sgd_steps(opt, p, 6)
    np.testing.assert_allclose(moves, [LR / 4, LR / 2, 3 * LR / 4, LR, LR, LR], rtol=1e-6)
    assert opt.param_groups[0]["lr"] == LR and dense_updates(opt) == 6


def test_adagrads_first_update_is_lr_over_w_instead_of_lr():
    """Adagrad's first step moves every weight by ~lr whatever its gradient: the overshoot the
    warm-up is for."""
    p = torch.zeros(2, requires_grad=True)
    opt = make_dense_optimizer("adagrad", [p], 0.01)
    p.grad = torch.tensor([1e-3, -5.0])
    dense_step(opt, 10)
    torch.testing.assert_close(p.detach(), torch.tensor([-1e-3, 1e-3]), rtol=1e-4, atol=1e-8)


def test_the_count_travels_in_the_state_dict():
    p = torch.zeros(1, requires_grad=True)
    opt = make_dense_optimizer("sgd", [p], LR)
    _sgd_steps(opt, p, 2)
    state = opt.state_dict()
    assert state["param_groups"][0]["lr"] == LR  # the configured lr, not a scaled one
    json.dumps(state["param_groups"])  # snapshots and model.json keep it as JSON
    q = torch.zeros(1, requires_grad=True)
    again = make_dense_optimizer("sgd", [q], LR)
    again.load_state_dict(state)
    np.testing.assert_allclose(_sgd_steps(again, q, 2), [3 * LR / 4, LR], rtol=1e-6)


def test_ps_dense_state_combines_the_warmup_with_eagers_lr_scale():
    s = DenseState(torch.zeros(2), "sgd", 0.2, warmup_steps=2)
    s.apply(torch.ones(2), lr_scale=0.5)  # 0.2 x 0.5 (tau) x 1/2 (warm-up)
    torch.testing.assert_close(s.params.detach(), torch.full((2,), -0.05))
    s.apply(torch.ones(2))
    torch.testing.assert_close(s.params.detach(), torch.full((2,), -0.25))
    assert s.optimizer.param_groups[0]["lr"] == pytest.approx(0.2)


TABLES = [TableSpec("a", 8, 2)]


def _ps_core(mode="async"):
    cfg = RunConfig(mode=mode, train={"dense_optimizer": "sgd", "dense_lr": LR,
                                      "dense_warmup_steps": W})
    return make_core(TABLES, cfg, 0, np.zeros(3, np.float32))


def _ps_update(core):
    before = core.pull([np.empty(0, np.int64)])[1].copy()
    push(core, [np.empty(0, np.int64)], [np.empty((0, 2), np.float32)],
         np.ones(3, np.float32), version_read=core.version)
    return float((before - core.pull([np.empty(0, np.int64)])[1])[0])


def test_shard_zero_built_from_the_config_warms_up_and_a_restore_goes_on():
    core = _ps_core()
    assert [_ps_update(core) for _ in range(2)] == pytest.approx([LR / 4, LR / 2])
    arrays, meta = core.snapshot()
    meta = json.loads(json.dumps(meta))  # as a checkpoint stores it
    restored = _ps_core()
    restored.restore(arrays, meta)
    assert [_ps_update(restored) for _ in range(3)] == pytest.approx([3 * LR / 4, LR, LR])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_warmup")
    generate(root, rows=512, eval_rows=64, spec=SynthSpec(seed=3, max_table_rows=40),
             processes=1, progress=False)
    return Dataset(root)


MODEL = ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8])
TRAIN = dict(dense_optimizer="sgd", dense_lr=LR, embedding_optimizer="sgd", seed=2)


def _batches(ds, n):
    return list(ds.batches(ds.chunks("train", 64)[0], 32))[:n]


def test_local_runs_first_update_is_a_wth_of_the_plain_one(tiny):
    batch = _batches(tiny, 1)[0]
    moves = []
    for warmup in (0, W):
        m = build_local_model(MODEL, TrainConfig(**TRAIN, dense_warmup_steps=warmup), tiny)
        before = parameters_to_vector(m.dense.parameters()).detach().clone()
        train_step(m, batch)
        moves.append(before - parameters_to_vector(m.dense.parameters()).detach())
    torch.testing.assert_close(moves[1], moves[0] / W)


def _sync_worker(tiny, cfg, core, dense_state=None):
    torch.manual_seed(0)
    built = model_for(cfg.model, tiny)
    client = PSClient(fake_shards([core]), [t.dim for t in built.tables])
    return SyncWorker(WorkerContext(rank=0, cfg=cfg, model=built.module, client=client,
                                    new_client=lambda: client, shards=client.shards,
                                    dense_state=dense_state, step_index=core.version))


def _sync_moves(worker, batches):
    """The learning rate each step applied: the parameters' move over the gradient."""
    rates = []
    for b in batches:
        before = parameters_to_vector(worker.params).detach().clone()
        worker.step(b)
        grad = parameters_to_vector([p.grad for p in worker.params])
        moved = before - parameters_to_vector(worker.params).detach()
        big = grad.abs() > 1e-4
        rates.append(float((moved[big] / grad[big]).mean()))
    return rates


def test_sync_replica_warms_up_and_the_count_survives_a_switch_to_gba_and_back(
        tiny, monkeypatch):
    patch_ray_get(monkeypatch)
    monkeypatch.setattr(sync_mod.dist, "all_reduce", lambda t: None)  # a group of one
    cfg = RunConfig(mode="sync", model=MODEL, train={**TRAIN, "dense_warmup_steps": W})
    built = model_for(MODEL, tiny)
    core = test_core(built.tables, RowSGD(lr=0.1), shard=0, num_shards=1, mode="sync")
    batches = _batches(tiny, 2)
    worker = _sync_worker(tiny, cfg, core)
    np.testing.assert_allclose(_sync_moves(worker, batches[:1]), [LR / 4], rtol=1e-4)
    # sync -> gba: shard 0 takes the replica's state (distributed/switching.py)
    state = worker.dense_state()
    core.install_dense(state["params"], "sgd", LR, state["optimizer"], 0.0, W)
    before = core.dense.params.detach().clone()
    core.dense.apply(torch.ones_like(before))
    torch.testing.assert_close(before - core.dense.params.detach(),
                               torch.full_like(before, LR / 2))
    # gba -> sync: fresh replicas take shard 0's state
    back = _sync_worker(tiny, cfg, core, core.take_dense())
    np.testing.assert_allclose(_sync_moves(back, batches), [3 * LR / 4, LR], rtol=1e-4)


def test_shadow_replica_warms_up_over_its_threads_steps():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    cfg = RunConfig(mode="shadow", train={"dense_optimizer": "sgd", "dense_lr": LR,
                                          "dense_warmup_steps": W},
                    shadow={"algorithm": "none", "hogwild_threads": 2})
    client = SimpleNamespace(shards=[])
    worker = ShadowWorker(WorkerContext(rank=0, cfg=cfg, model=model, client=client,
                                        new_client=lambda: client, shards=[]))
    moves = []
    for _ in range(5):
        before = worker.replica.vector()
        worker.replica.apply([torch.ones_like(p) for p in worker.replica.params])
        moves.append(float((before - worker.replica.vector())[0]))
    np.testing.assert_allclose(moves, [LR / 4, LR / 2, 3 * LR / 4, LR, LR], rtol=1e-5)


def test_init_from_keeps_the_saved_states_update_count():
    files = SimpleNamespace(dense_optimizer_state={
        "state": {0: {"sum": torch.ones(3), "step": torch.tensor(7.0)}},
        "param_groups": [{"lr": 0.5, UPDATES: 7, "params": [0]}]})
    cfg = RunConfig(train={"dense_lr": LR, "dense_warmup_steps": W})
    flat = flat_optimizer_state(files, cfg, 3)
    assert flat["param_groups"][0][UPDATES] == 7 and flat["param_groups"][0]["lr"] == LR
