"""Gradient aggregation on a PS shard: the buffer that turns several workers' gradients into one
update, and the staleness decay of GBA (docs/design.md §6.3). Plain Python, tested without Ray.

A contribution is one worker's gradient on its batch, pre-multiplied by the batch's sample count
n (rows: per-table ids and grads x n; dense: grad x n). The buffer's update is

    Σ_i w_i · n_i · g_i  /  Σ_i n_i

per row (rows aggregate by id) and for the dense vector, where w_i is the contribution's
staleness weight (1 unless GBA decays it). With every w_i = 1 this is the gradient of the mean
loss over the union of the batches: exactly one step on the global batch, as in sync mode. A
decayed gradient still counts its samples in the denominator, so it moves the parameters less
than a fresh one; a dropped gradient is never added.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DECAYS = ("inverse", "drop", "none")


@dataclass(frozen=True)
class StalenessDecay:
    """GBA's f(τ): gradients with staleness τ <= ``threshold`` (ι) count fully; beyond it,
    ``inverse`` weighs them 1 / (1 + τ - ι), ``drop`` drops them (weight 0), ``none`` keeps them
    whole."""

    threshold: int
    kind: str = "inverse"

    def __post_init__(self):
        if self.kind not in DECAYS:
            raise ValueError(f"unknown staleness decay {self.kind!r}; valid: {list(DECAYS)}")
        if self.threshold < 0:
            raise ValueError(f"staleness threshold must be >= 0, got {self.threshold}")

    def weight(self, staleness: int) -> float:
        if staleness <= self.threshold or self.kind == "none":
            return 1.0
        if self.kind == "drop":
            return 0.0
        return 1.0 / (1 + staleness - self.threshold)


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a``; arrays Ray hands over are read-only, so those are copied."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


class GradientBuffer:
    """Contributions waiting to be applied together. Not thread-safe (a shard applies one
    call at a time)."""

    def __init__(self):
        self._parts: list[tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None, float]] = []
        self.samples = 0

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, ids: list[np.ndarray], grads: list[np.ndarray], dense_grad: np.ndarray | None,
            samples: int, weight: float = 1.0) -> None:
        """One contribution: per table, unique int64 ``ids`` and their ``grads`` x ``samples``;
        ``dense_grad`` x ``samples`` or None. The arrays are kept, not copied."""
        self._parts.append((ids, grads, dense_grad, weight))
        self.samples += samples

    def mean(self) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None] | None:
        """Per table (unique ids, aggregated row grads) and the dense gradient (None if no
        contribution had one), each divided by the buffer's samples; empties the buffer.
        None if the contributions held no samples (nothing to apply)."""
        parts, total = self._parts, self.samples
        self._parts, self.samples = [], 0
        if total == 0:
            return None
        merged_ids, merged_grads = [], []
        for t in range(len(parts[0][0])):
            ids_t = as_tensor(np.concatenate([p[0][t] for p in parts]))
            grads_t = torch.cat([as_tensor(p[1][t]) * p[3] if p[3] != 1.0 else as_tensor(p[1][t])
                                 for p in parts])
            uniq, inverse = torch.unique(ids_t, return_inverse=True)
            summed = torch.zeros(len(uniq), grads_t.shape[1]).index_add_(0, inverse, grads_t)
            merged_ids.append(uniq.numpy())
            merged_grads.append((summed / total).numpy())
        dense = [(as_tensor(p[2]), p[3]) for p in parts if p[2] is not None]  # empty pushes: None
        dense_grad = (sum(g * w for g, w in dense) / total).numpy() if dense else None
        return merged_ids, merged_grads, dense_grad
