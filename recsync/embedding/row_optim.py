"""Row-wise optimizers for embedding rows, applied to (unique rows, grads) by the row's owner.

Each optimizer keeps ``state_dim`` float32 numbers of state per row (0 for SGD, 1 for row-wise
Adagrad) so that the owner of the rows (a local store or a PS shard) can allocate, snapshot and
restore state without knowing the rule. ``apply`` is pure arithmetic on gathered rows, easy to
test against a hand computation; ``apply_to_table`` updates rows in place inside a whole table,
in the cheapest way the rule allows (it must equal gather, ``apply``, scatter), and
``apply_to_rows`` the rows of several tables of one call at once, in the one storage the
store keeps them in (the same result as one ``apply_to_table`` per table: a push of 26 tables
was mostly the rule's per-table op calls).

``weight_decay`` is L2 on the rows an update touches, as parameter servers apply it: the
gradient becomes grads + weight_decay * rows before the rule (rows no batch touches do not
decay; a row decays once per push that carries it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# rows updated at once (RowAdagrad.apply_to_rows): fusing saves the rule's per-table op
# calls; more than this made a push slower (its working set leaves the cache): A/B at 64 to
# 16,384 ids x 26 tables, 2026-11-27 (docs/benchmarks/2026-11-27-ps-direct.md)
FUSED_ROWS = 16_384


def decayed(grads: torch.Tensor, rows: torch.Tensor, weight_decay: float) -> torch.Tensor:
    """grads + weight_decay * rows (a new tensor; ``grads`` itself when there is no decay)."""
    return grads.add(rows, alpha=weight_decay) if weight_decay else grads


@dataclass(frozen=True)
class RowSGD:
    """rows <- rows - lr * (grads + weight_decay * rows)"""

    lr: float
    state_dim: int = 0
    initial_state: float = 0.0
    weight_decay: float = 0.0

    def apply(self, rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor,
              lr_scale: float = 1.0) -> None:
        """Update ``rows`` [n, dim] in place from ``grads`` [n, dim]; ``state`` is unused."""
        rows.sub_(decayed(grads, rows, self.weight_decay), alpha=self.lr * lr_scale)

    def apply_to_table(self, weights: torch.Tensor, state: torch.Tensor, local: torch.Tensor,
                       grads: torch.Tensor, lr_scale: float = 1.0) -> None:
        """Update rows ``local`` (unique) of ``weights`` in place: one scatter-add."""
        if self.weight_decay:
            grads = decayed(grads, weights.index_select(0, local), self.weight_decay)
        weights.index_add_(0, local, grads, alpha=-self.lr * lr_scale)

    def apply_to_rows(self, weights: torch.Tensor, state: torch.Tensor, local: np.ndarray,
                      grads: np.ndarray, lr_scale: float = 1.0) -> None:
        """``apply_to_table`` of arrays: a scatter-add needs no chunks."""
        self.apply_to_table(weights, state, torch.from_numpy(local), torch.from_numpy(grads),
                            lr_scale)


@dataclass(frozen=True)
class RowAdagrad:
    """Row-wise Adagrad (one accumulator per row, as in DLRM/FBGEMM):

    g = grads + weight_decay * rows;  state <- state + mean(g², over the row);
    rows <- rows - lr * g / (sqrt(state) + eps)
    """

    lr: float
    eps: float = 1e-8
    initial_state: float = 0.0
    state_dim: int = 1
    weight_decay: float = 0.0

    def apply(self, rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor,
              lr_scale: float = 1.0) -> None:
        """Update ``rows`` [n, dim] and ``state`` [n, 1] in place from ``grads`` [n, dim]."""
        grads = decayed(grads, rows, self.weight_decay)
        state.add_(grads.square().mean(dim=1, keepdim=True))
        rows.addcdiv_(grads, state.sqrt().add_(self.eps), value=-self.lr * lr_scale)

    def apply_to_table(self, weights: torch.Tensor, state: torch.Tensor, local: torch.Tensor,
                       grads: torch.Tensor, lr_scale: float = 1.0) -> None:
        """Update rows ``local`` (unique) of ``weights`` and ``state`` in place (CPU tensors,
        as a store holds them). Gathered and scattered by numpy: its ``take`` and fancy
        assignment moved a push's rows faster than ``index_select`` / ``index_copy_``
        (26 x 256 ids: 1.3 -> 1.0 ms, 26 x 2,048: 10.0 -> 8.2 ms; docs/benchmarks/
        2026-11-27-night.md)."""
        self._update(weights.numpy(), state.numpy(), local.numpy(), grads.detach().numpy(),
                     lr_scale)

    def apply_to_rows(self, weights: torch.Tensor, state: torch.Tensor, local: np.ndarray,
                      grads: np.ndarray, lr_scale: float = 1.0) -> None:
        """``apply_to_table`` of arrays (``local`` int64, ``grads`` float32), in chunks of at
        most ``FUSED_ROWS`` rows (the rows of several tables in their one storage: more at
        once was slower, as the working set then leaves the cache)."""
        w, s = weights.numpy(), state.numpy()
        for start in range(0, len(local), FUSED_ROWS):
            self._update(w, s, local[start:start + FUSED_ROWS],
                         grads[start:start + FUSED_ROWS], lr_scale)

    def _update(self, w: np.ndarray, s: np.ndarray, at: np.ndarray, grads: np.ndarray,
                lr_scale: float) -> None:
        """``apply``'s arithmetic in numpy on rows ``at`` of ``w`` and ``s``: at a push's
        usual few hundred rows per shard torch's per-op overhead made it twice as slow (50
        against 28 us at 373 rows; equal from a few thousand rows on, 2026-11-28)."""
        rows, row_state = w.take(at, axis=0), s.take(at, axis=0)
        if self.weight_decay:
            grads = grads + np.float32(self.weight_decay) * rows
        row_state += np.einsum("ij,ij->i", grads, grads)[:, None] * np.float32(
            1.0 / grads.shape[1])
        rows -= np.float32(self.lr * lr_scale) * grads / (np.sqrt(row_state)
                                                          + np.float32(self.eps))
        w[at] = rows
        s[at] = row_state


ROW_OPTIMIZERS = {"sgd": RowSGD, "adagrad": RowAdagrad}


def make_row_optimizer(name: str, lr: float, weight_decay: float = 0.0, **kwargs):
    """Build a row optimizer by name (``weight_decay``: train.embedding_weight_decay); unknown
    names raise ValueError listing the valid ones."""
    if name not in ROW_OPTIMIZERS:
        raise ValueError(f"unknown embedding optimizer {name!r}; valid: {sorted(ROW_OPTIMIZERS)}")
    if weight_decay < 0:
        raise ValueError(f"embedding weight decay must be >= 0, got {weight_decay}")
    return ROW_OPTIMIZERS[name](lr=lr, weight_decay=weight_decay, **kwargs)
