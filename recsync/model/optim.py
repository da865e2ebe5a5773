"""The dense optimizers by name (train.dense_optimizer): used by the local run, by workers that
hold a dense replica and by the PS shard that holds the dense vector."""

from __future__ import annotations

import torch

DENSE_OPTIMIZERS = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
                    "sgd": torch.optim.SGD}


def make_dense_optimizer(name: str, params, lr: float,
                         weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """``weight_decay`` (train.dense_weight_decay): L2 added to the gradient, grad += wd * p
    (torch's weight_decay; for Adam that is L2, not AdamW's decoupled decay)."""
    if name not in DENSE_OPTIMIZERS:
        raise ValueError(f"train.dense_optimizer: unknown optimizer {name!r}; valid: "
                         f"{sorted(DENSE_OPTIMIZERS)}")
    return DENSE_OPTIMIZERS[name](params, lr=lr, weight_decay=weight_decay)
