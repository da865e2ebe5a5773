"""The dense optimizers by name (train.dense_optimizer): used by the local run, by workers that
hold a dense replica and by the PS shard that holds the dense vector."""

from __future__ import annotations

import torch

DENSE_OPTIMIZERS = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
                    "sgd": torch.optim.SGD}


def make_dense_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name not in DENSE_OPTIMIZERS:
        raise ValueError(f"train.dense_optimizer: unknown optimizer {name!r}; valid: "
                         f"{sorted(DENSE_OPTIMIZERS)}")
    return DENSE_OPTIMIZERS[name](params, lr=lr)
