"""Pieces the built-in models share: MLPs with dropout, the output bias at the base rate, and
the slots of a forward pass's embeddings."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn


def mlp(sizes: list[int], *, dropout: float = 0.0, final_activation: bool = False,
        bias: bool = True) -> nn.Sequential:
    """Linear layers ``sizes[0] -> ... -> sizes[-1]`` with ReLU between them and dropout after
    every hidden layer's ReLU (not after the output: a final activation has no dropout).
    ``bias`` is the last layer's (a model whose logit is a sum keeps one bias elsewhere)."""
    layers: list[nn.Module] = []
    pairs = list(zip(sizes[:-1], sizes[1:]))
    for i, (a, b) in enumerate(pairs):
        last = i == len(pairs) - 1
        layers.append(nn.Linear(a, b, bias=bias or not last))
        if not last or final_activation:
            layers.append(nn.ReLU())
        if not last and dropout > 0:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def base_logit(base_rate: float | None) -> float | None:
    """The log-odds of the base rate (the training labels' mean), None when not in (0, 1)."""
    if base_rate is None or not 0.0 < base_rate < 1.0:
        return None
    return math.log(base_rate / (1.0 - base_rate))


@torch.no_grad()
def init_output_bias(layer: nn.Linear, base_rate: float | None) -> None:
    """Start the model's one output bias at logit(base_rate): the first predictions are the
    base rate rather than 0.5, so early steps do not spend themselves learning the average."""
    value = base_logit(base_rate)
    if value is not None:
        layer.bias.fill_(value)


def dense_linear(num_dense: int, base_rate: float | None) -> nn.Linear:
    """The linear layer on dense features whose bias is a sum-model's one output bias (a data
    set may have no dense features: then it is the bias alone)."""
    with warnings.catch_warnings():  # torch warns that a [1, 0] weight has nothing to init
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")
        layer = nn.Linear(num_dense, 1)
    init_output_bias(layer, base_rate)
    return layer


def slots(embeddings) -> tuple[torch.Tensor, ...]:
    """The embeddings as a tuple of [B, dim] tensors; a plain [B, slots, dim] tensor is
    unbound (views)."""
    if isinstance(embeddings, torch.Tensor):
        return embeddings.unbind(1)
    return tuple(embeddings)


def split_slots(embeddings, count: int, what: str):
    """The first ``count`` slots and the rest, for a model that looks every feature up in two
    table sets (deep and linear); a plain tensor is refused, as its slots cannot differ in
    width."""
    if isinstance(embeddings, torch.Tensor):
        raise TypeError(f"{what} takes its embeddings as a sequence of [B, dim] tensors (two "
                        f"table sets of different widths), not one [B, slots, dim] tensor")
    s = slots(embeddings)
    if len(s) != 2 * count:
        raise ValueError(f"{what}: expected {2 * count} embeddings ({count} deep + {count} "
                         f"linear), got {len(s)}")
    return s[:count], s[count:]
