"""The update rules of ShadowSync's three algorithms (docs/design.md §6.4), as plain tensor
arithmetic.

Each rule says where a trainer's dense replica ``w`` should be after one synchronization; the
caller (synchronizers.py) applies the move as a delta, ``w += target - snapshot``, so that the
Hogwild updates that landed while the round ran are kept rather than overwritten.

- EASGD (elastic averaging): with the center copy ``c`` held by the PS,
  ``d = alpha * (w - c)``; the trainer moves to ``w - d`` and the center to ``c + d``.
- MA (model averaging): every trainer moves to the mean of all replicas.
- BMUF (block-wise model update filtering): from the mean ``m`` of all replicas,
  ``delta <- eta * delta + zeta * (m - w_g)``, ``w_g <- w_g + delta``; every trainer moves to
  ``w_g`` (or, with Nesterov's look-ahead, to ``w_g + eta * delta``).

Tested against hand computations in tests/unit/test_shadow.py.
"""

from __future__ import annotations

import torch


def easgd_delta(replica: torch.Tensor, center: torch.Tensor, alpha: float) -> torch.Tensor:
    """d = alpha (w - c): the replica moves by -d, the center by +d."""
    return (replica - center).mul_(alpha)


def mean_of(summed: torch.Tensor, trainers: int) -> torch.Tensor:
    """MA: the mean of the replicas from their all-reduced sum."""
    return summed / trainers


class BMUF:
    """The global model ``w_g`` and block momentum ``delta`` every trainer keeps (identical on
    all of them: each computes them from the same all-reduced mean)."""

    def __init__(self, initial: torch.Tensor, momentum: float, block_lr: float = 1.0,
                 nesterov: bool = False):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"BMUF block momentum must be in [0, 1), got {momentum}")
        self.global_model = initial.detach().clone()
        self.delta = torch.zeros_like(self.global_model)
        self.momentum, self.block_lr, self.nesterov = momentum, block_lr, nesterov

    def load(self, state: dict) -> None:
        """The group's global model and block momentum (``state``: another trainer's), for a
        trainer that joins it."""
        self.global_model = torch.tensor(state["global_model"])  # copies
        self.delta = torch.tensor(state["delta"])

    def update(self, mean: torch.Tensor) -> torch.Tensor:
        """One block update from the replicas' mean; returns where every replica moves to."""
        self.delta.mul_(self.momentum).add_(mean - self.global_model, alpha=self.block_lr)
        self.global_model.add_(self.delta)
        if self.nesterov:
            return self.global_model + self.momentum * self.delta
        return self.global_model.clone()
