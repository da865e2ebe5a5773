"""Dense optimizer state handed between per-parameter replicas (sync) and the PS's flat vector
(gba): after a handover either side takes exactly the steps the other would have."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from recsync.ps.core import DenseState
from recsync.modes.handover import from_flat, to_flat
from recsync.model.optim import DENSE_OPTIMIZERS


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def grads_for(m, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in m.parameters()]


def step(m, opt, seed):
    for p, g in zip(m.parameters(), grads_for(m, seed)):
        p.grad = g
    opt.step()


@pytest.mark.parametrize("name", ["adagrad", "adam", "sgd"])
def test_replica_to_ps_and_back_continues_the_same_trajectory(name):
    ref, m = model(), model()
    ref_opt = DENSE_OPTIMIZERS[name](ref.parameters(), lr=0.05)
    opt = DENSE_OPTIMIZERS[name](m.parameters(), lr=0.05)
    shapes = [p.shape for p in m.parameters()]
    for s in range(3):  # sync: both replicas step
        step(ref, ref_opt, s)
        step(m, opt, s)
    # sync -> gba: the PS takes the replica's parameters and optimizer state
    ps = DenseState(parameters_to_vector(m.parameters()).detach(), name, 0.05)
    ps.optimizer.load_state_dict(to_flat(opt.state_dict(), shapes))
    for s in range(3, 6):
        step(ref, ref_opt, s)
        ps.apply(torch.cat([g.reshape(-1) for g in grads_for(m, s)]))
    torch.testing.assert_close(ps.params.detach(), parameters_to_vector(ref.parameters()).detach())
    # gba -> sync: a fresh replica takes them back
    back = model()
    back_opt = DENSE_OPTIMIZERS[name](back.parameters(), lr=0.05)
    torch.nn.utils.vector_to_parameters(ps.params.detach().clone(), back.parameters())
    back_opt.load_state_dict(from_flat(ps.optimizer.state_dict(), shapes))
    for s in range(6, 9):
        step(ref, ref_opt, s)
        step(back, back_opt, s)
    torch.testing.assert_close(parameters_to_vector(back.parameters()),
                               parameters_to_vector(ref.parameters()))


def test_a_state_before_any_step_hands_over_empty():
    m = model()
    opt = torch.optim.Adam(m.parameters(), lr=0.1)  # Adam creates its state at the first step
    shapes = [p.shape for p in m.parameters()]
    flat = to_flat(opt.state_dict(), shapes)
    assert flat["state"] == {} and flat["param_groups"][0]["params"] == [0]
    assert from_flat(flat, shapes)["param_groups"][0]["params"] == [0, 1, 2, 3]
