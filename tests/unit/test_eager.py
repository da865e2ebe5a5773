"""Mode eager without Ray: the modulation function, the order of pulls and pushes (the next
pull goes out before this step's push), versions tracked per pulled batch whatever order pulls
complete in, the multiplier reaching the shard, the in-flight bound, and no push left behind."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.nn.utils import parameters_to_vector

import recsync.ps.client as client_mod
from fake_ps import fake_shards, patch_ray_get
from cores import test_core, worker_half
from recsync.config import ModelConfig, TrainConfig
from recsync.data.reader import Dataset
from recsync.data.synthetic import SynthSpec, generate
from recsync.embedding.row_optim import RowSGD
from recsync.model.setup import model_for
from recsync.ps.client import PSClient
from recsync.ps.core import DenseState
from recsync.modes.eager import EagerWorker, modulation
from recsync.modes.sections import EagerConfig


def test_modulation_functions():
    inverse = modulation("inverse")
    assert [inverse(t) for t in (0, 1, 2, 4)] == [1.0, 1.0, 0.5, 0.25]
    assert modulation("none")(7) == 1.0
    assert modulation("inverse_sqrt")(4) == 0.5
    with pytest.raises(ValueError, match="valid"):
        modulation("exp")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_eager")
    generate(root, rows=1024, eval_rows=128, spec=SynthSpec(seed=8, max_table_rows=40),
             processes=1, progress=False)
    return Dataset(root)


@pytest.fixture
def no_ray(monkeypatch):
    patch_ray_get(monkeypatch)  # fake calls answer at once, so every answer has arrived
    monkeypatch.setattr(client_mod.ray, "wait",
                        lambda refs, num_returns=1, timeout=None: (list(refs), []))


def _setup(tiny, shards=2, workers=1, overlap=True, lr_modulation="inverse", log=None,
           own_update="wait", dense_optimizer="sgd"):
    model_cfg = ModelConfig(embedding_dim=4, bottom_mlp=[8], top_mlp=[8])
    models = []
    for _ in range(workers):
        torch.manual_seed(0)
        built = model_for(model_cfg, tiny)
        models.append((built.module, built.tables))
    tables = models[0][1]
    init = parameters_to_vector(models[0][0].parameters()).detach().clone()
    cores = [test_core(tables, RowSGD(lr=0.1), shard=s, num_shards=shards, num_workers=workers,
                       dense=DenseState(init, dense_optimizer, 0.1) if s == 0 else None)
             for s in range(shards)]
    handles = fake_shards(cores)
    if log is not None:  # record every call in order: (kind, shard, lr_scale)
        for s, h in enumerate(handles):
            pull, push = h.pull.remote, h.push.remote
            h.pull = SimpleNamespace(remote=lambda *a, f=pull, s=s, **k: (
                log.append(("pull", s, a[3] if len(a) > 3 else "vector")), f(*a, **k))[1])
            h.push = SimpleNamespace(remote=lambda *a, f=push, s=s: (
                log.append(("push", s, a[3]["lr_scale"], a[3].get("dense_lr_scale"))), f(*a))[1])
    modes = [worker_half(EagerWorker, m, PSClient(handles, [t.dim for t in tables], dense_shard=0),
                         eager=EagerConfig(overlap=overlap, lr_modulation=lr_modulation,
                                           own_update=own_update),
                         train=TrainConfig(dense_optimizer=dense_optimizer, dense_lr=0.1))
             for m, _ in models]
    batches = list(tiny.batches(tiny.chunks("train", 256)[0], 32))
    return cores, modes, batches


def _run(mode, batches):
    for b, nxt in zip(batches, batches[1:] + [None]):
        mode.step(b, nxt)
    mode.finish()


def test_eager_sends_the_next_pull_before_this_steps_push(tiny, no_ray):
    log = []
    cores, (mode,), batches = _setup(tiny, shards=1, log=log)
    _run(mode, batches[:3])
    assert [e[0] for e in log] == ["pull", "pull", "push", "pull", "push", "push"]


def test_sequential_pulls_computes_and_pushes_in_turn(tiny, no_ray):
    log = []
    cores, (mode,), batches = _setup(tiny, shards=1, overlap=False, log=log)
    _run(mode, batches[:3])
    assert [e[0] for e in log] == ["pull", "push"] * 3
    assert mode.taus == {0: 3}  # it never reads ahead: it knows of no update it missed


def test_versions_follow_each_pulled_batch_whatever_order_pulls_complete_in(tiny, no_ray):
    cores, (mode,), batches = _setup(tiny, shards=2)
    client = mode.ctx.client
    first = client.pull_async(batches[0].sparse)      # reads version 0 on both shards
    update = client.pull(batches[1].sparse)
    update.rows.grad = torch.zeros_like(update.rows)
    client.push(update)                               # an update: both shards at version 1
    second = client.pull_async(batches[2].sparse)     # reads version 1
    late, early = client.complete(second), client.complete(first)  # completed in reverse
    assert late.versions == [1, 1] and early.versions == [0, 0]
    assert client.known_versions() == [1, 1]
    late.rows.grad = torch.zeros_like(late.rows)
    early.rows.grad = torch.zeros_like(early.rows)
    client.push(early)
    client.push(late)
    client.flush()
    # each push carried the version its own batch read: staleness 1 - 0 and 2 - 1
    assert [c.staleness for c in cores] == [{0: 1, 1: 2}] * 2


def test_a_stale_update_is_applied_with_a_smaller_learning_rate(tiny, no_ray):
    """Worker a reads version 0, then worker b makes two updates before a pushes: a knows (from
    its next pull) that it missed 2, and the shards apply its update with lr x 1/2."""
    log = []
    cores, (a, b), batches = _setup(tiny, shards=2, workers=2, log=log)
    a_pull = a.ctx.client.pull_async(batches[0].sparse)
    _run(b, batches[1:3])
    a._next = a_pull
    a.step(batches[0], batches[3])
    a_scales = [e[2] for e in log if e[0] == "push"][-2:]
    assert a_scales == [0.5, 0.5]
    assert a.taus == {2: 2} and a.multiplier_min == 0.5
    assert cores[0].staleness[2] == 1  # the shard saw it 2 updates stale as well


def test_at_most_push_window_pushes_per_shard_are_in_flight(tiny, monkeypatch):
    waited = []
    monkeypatch.setattr(client_mod.ray, "get", lambda x: (waited.append(x), x)[1]
                        if not isinstance(x, list) else x)
    monkeypatch.setattr(client_mod.ray, "wait",
                        lambda refs, num_returns=1, timeout=None: (list(refs), []))
    # the dense vector's answers are waited for besides the window: counted in the next test
    cores, (mode,), batches = _setup(tiny, shards=2, own_update="none")
    mode.ctx.client.push_window = 2
    in_flight = []
    for b, nxt in zip(batches[:6], batches[1:7]):
        mode.step(b, nxt)
        in_flight.append(len(mode.ctx.client._in_flight))
    assert max(in_flight) == 2 * 2 and in_flight[-1] == 4
    assert len([w for w in waited if isinstance(w, (int, np.integer))]) == 6 * 2 - 4


def test_no_push_is_left_behind_at_the_end(tiny, no_ray):
    cores, (mode,), batches = _setup(tiny, shards=2)
    _run(mode, batches[:5])
    assert len(mode.ctx.client._in_flight) == 0
    assert [c.stats()["pushes"] for c in cores] == [5, 5]
    assert [c.version for c in cores] == [5, 5]


@pytest.mark.parametrize("own_update,optimizer", [("local", "sgd"), ("local", "adagrad"),
                                                  ("local", "adam"), ("wait", "adagrad")])
def test_each_step_computes_on_the_dense_vector_its_own_last_push_left(tiny, no_ray, own_update,
                                                                        optimizer):
    """With overlap the next batch's pull leaves before this step's push, so it lacks this
    worker's own update; the next step computes on the dense vector the push left on the
    shard all the same: applied on the worker ("local", from the optimizer state the pull read)
    or taken from the push's answer ("wait": the early pulls carry rows only)."""
    log = []
    cores, (mode,), batches = _setup(tiny, shards=2, log=log, own_update=own_update,
                                     dense_optimizer=optimizer)
    seen, compute = [], mode.compute
    mode.compute = lambda batch, pulled: (seen.append(pulled.dense.copy()), compute(batch, pulled))[1]
    after = []
    for b, nxt in zip(batches[:4], batches[1:5]):
        mode.step(b, nxt)
        after.append(cores[0].dense_vector())  # no one else pushes: the shard's vector now
    mode.finish()
    for used, left in zip(seen[1:], after):
        np.testing.assert_allclose(used, left, rtol=1e-6, atol=1e-7)
    assert not np.allclose(seen[1], seen[0])  # the first push moved it
    early = [e for e in log if e[0] == "pull"][2:]  # after the first step's full pulls (2 shards)
    want = {"local": "with_state", "wait": "none"}[own_update]
    assert early and all(dense == want for _, _, dense in early)


def test_without_its_own_update_the_next_step_computes_on_the_vector_before_it(tiny, no_ray):
    cores, (mode,), batches = _setup(tiny, shards=1, own_update="none")
    seen, compute = [], mode.compute
    mode.compute = lambda batch, pulled: (seen.append(pulled.dense.copy()), compute(batch, pulled))[1]
    _run(mode, batches[:2])
    np.testing.assert_array_equal(seen[0], seen[1])  # pulled before the first push


@pytest.mark.parametrize("flushed_first", [False, True])
def test_a_lost_push_leaves_the_dense_vector_to_a_fresh_read(tiny, no_ray, flushed_first):
    """Partial recovery, own_update "wait": the push that was to bring the dense vector back
    died with its shard (counted as lost once, also when a pause's flush met it first); the
    next step reads the shard's vector as it is."""
    cores, (mode,), batches = _setup(tiny, shards=2, own_update="wait")
    client = mode.ctx.client
    mode.step(batches[0], batches[1])
    client._dense_ref = object()  # an answer that never comes: its shard died
    client.survive_shard_restarts = True
    real_get = client_mod.ray.get

    def get(x):
        if not isinstance(x, (list, tuple, np.ndarray)) and type(x) is object:
            raise client_mod.ray.exceptions.RayActorError()
        return real_get(x)
    client_mod.ray.get = get
    try:
        if flushed_first:
            client._in_flight.append(client._dense_ref)
            client.flush()
        dense, version = client.dense_after_push()
    finally:
        client_mod.ray.get = real_get
    np.testing.assert_array_equal(dense, cores[0].dense_vector())
    assert version == cores[0].version and client.lost_pushes == 1


@pytest.mark.parametrize("own_update", ["wait", "local"])
def test_the_dense_update_is_modulated_by_the_staleness_of_the_vector_it_computed_on(
        tiny, no_ray, own_update):
    """One worker: its rows were read before its own last push (τ 1), but its dense vector
    holds that push, so the dense update is not stale (τ 0); the dense shard gets the dense
    part's multiplier beside the rows' (m(τ) = 1 / τ here, to tell them apart)."""
    log = []
    cores, (mode,), batches = _setup(tiny, shards=2, log=log, own_update=own_update)
    mode.m = lambda tau: 1.0 / (1 + tau)
    _run(mode, batches[:4])
    dense_shard = [e for e in log if e[0] == "push" and e[1] == 0]
    # the rows': τ 1 while the next batch's pull went out before the push (not the last step)
    assert [e[2] for e in dense_shard[1:3]] == [0.5, 0.5]
    assert [e[3] for e in dense_shard] == [1.0] * 4  # the dense vector's: τ 0
    assert all(e[3] is None for e in log if e[0] == "push" and e[1] == 1)  # no dense there
    assert mode.dense_taus == {0: 4} and mode.taus[1] >= 4
