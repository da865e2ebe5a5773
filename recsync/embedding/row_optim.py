"""Row-wise optimizers for embedding rows, applied to (unique rows, grads) by the row's owner.

Each optimizer keeps ``state_dim`` float32 numbers of state per row (0 for SGD, 1 for row-wise
Adagrad) so that the owner of the rows (a local store or a PS shard) can allocate, snapshot and
restore state without knowing the rule. ``apply`` is pure arithmetic on the gathered rows, which
makes it easy to test against a hand computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSGD:
    """rows <- rows - lr * grads"""

    lr: float
    state_dim: int = 0
    initial_state: float = 0.0

    def apply(self, rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor,
              lr_scale: float = 1.0) -> None:
        """Update ``rows`` [n, dim] in place from ``grads`` [n, dim]; ``state`` is unused."""
        rows.sub_(grads, alpha=self.lr * lr_scale)


@dataclass(frozen=True)
class RowAdagrad:
    """Row-wise Adagrad (one accumulator per row, as in DLRM/FBGEMM):

    state <- state + mean(grads², over the row);  rows <- rows - lr * grads / (sqrt(state) + eps)
    """

    lr: float
    eps: float = 1e-8
    initial_state: float = 0.0
    state_dim: int = 1

    def apply(self, rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor,
              lr_scale: float = 1.0) -> None:
        """Update ``rows`` [n, dim] and ``state`` [n, 1] in place from ``grads`` [n, dim]."""
        state.add_(grads.square().mean(dim=1, keepdim=True))
        rows.addcdiv_(grads, state.sqrt().add_(self.eps), value=-self.lr * lr_scale)


ROW_OPTIMIZERS = {"sgd": RowSGD, "adagrad": RowAdagrad}


def make_row_optimizer(name: str, lr: float, **kwargs):
    """Build a row optimizer by name; unknown names raise ValueError listing the valid ones."""
    if name not in ROW_OPTIMIZERS:
        raise ValueError(f"unknown embedding optimizer {name!r}; valid: {sorted(ROW_OPTIMIZERS)}")
    return ROW_OPTIMIZERS[name](lr=lr, **kwargs)
