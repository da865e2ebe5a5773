"""L2 on the embedding rows a push touches (both row optimizers, ``apply`` and
``apply_to_table``) and on dense parameters, against hand computations."""

from __future__ import annotations

import pytest
import torch

from recsync.embedding.row_optim import RowAdagrad, RowSGD, make_row_optimizer
from recsync.model.optim import make_dense_optimizer

LR, WD, EPS = 0.3, 0.05, 1e-8


def rows_and_grads():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)


def sgd_by_hand(rows, grads):
    return rows - LR * (grads + WD * rows)


def adagrad_by_hand(rows, state, grads):
    g = grads + WD * rows
    state = state + (g ** 2).mean(dim=1, keepdim=True)
    return rows - LR * g / (state.sqrt() + EPS), state


def test_row_sgd_decays_the_rows_it_updates():
    rows, grads = rows_and_grads()
    got = rows.clone()
    RowSGD(lr=LR, weight_decay=WD).apply(got, torch.empty(3, 0), grads)
    assert torch.allclose(got, sgd_by_hand(rows, grads))


def test_row_adagrad_decays_the_rows_it_updates():
    rows, grads = rows_and_grads()
    state = torch.full((3, 1), 0.5)
    got_rows, got_state = rows.clone(), state.clone()
    RowAdagrad(lr=LR, eps=EPS, weight_decay=WD).apply(got_rows, got_state, grads)
    want_rows, want_state = adagrad_by_hand(rows, state, grads)
    assert torch.allclose(got_rows, want_rows) and torch.allclose(got_state, want_state)


@pytest.mark.parametrize("opt", [RowSGD(lr=LR, weight_decay=WD),
                                 RowAdagrad(lr=LR, eps=EPS, weight_decay=WD)])
def test_apply_to_table_touches_and_decays_only_the_pushed_rows(opt):
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(6, 4, generator=g)
    state = torch.full((6, opt.state_dim), 0.25)
    local, grads = torch.tensor([4, 0, 2]), torch.randn(3, 4, generator=g)
    before, grads_before = weights.clone(), grads.clone()
    w, s = weights.clone(), state.clone()
    opt.apply_to_table(w, s, local, grads, lr_scale=0.5)
    rows, row_state = before[local].clone(), state[local].clone()
    opt.apply(rows, row_state, grads, lr_scale=0.5)  # gather, apply, scatter
    assert torch.allclose(w[local], rows) and torch.allclose(s[local], row_state)
    untouched = [1, 3, 5]
    assert torch.equal(w[untouched], before[untouched])
    assert torch.equal(grads, grads_before)  # the caller's gradients are not changed


def test_no_decay_is_the_plain_rule():
    rows, grads = rows_and_grads()
    a, b = rows.clone(), rows.clone()
    RowSGD(lr=LR).apply(a, torch.empty(3, 0), grads)
    RowSGD(lr=LR, weight_decay=0.0).apply(b, torch.empty(3, 0), grads)
    assert torch.equal(a, b) and torch.allclose(a, rows - LR * grads)


def test_make_row_optimizer_weight_decay():
    assert make_row_optimizer("sgd", 0.3, weight_decay=0.01) == RowSGD(lr=0.3, weight_decay=0.01)
    assert make_row_optimizer("adagrad", 0.3) == RowAdagrad(lr=0.3)
    with pytest.raises(ValueError, match="weight decay"):
        make_row_optimizer("sgd", 0.3, weight_decay=-1.0)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_dense_weight_decay(name):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4))
    q = torch.nn.Parameter(p.detach().clone())
    grad = torch.randn(4)
    p.grad, q.grad = grad.clone(), grad + WD * q.detach()
    make_dense_optimizer(name, [p], LR, weight_decay=WD).step()
    make_dense_optimizer(name, [q], LR).step()  # the same step with the L2 term by hand
    assert torch.allclose(p, q, atol=1e-6)
