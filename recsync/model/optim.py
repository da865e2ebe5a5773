"""The dense optimizers by name (train.dense_optimizer): used by the local run, by workers that
hold a dense replica and by the PS shard that holds the dense vector; and ``dense_step``, the
one way each of them takes a step (with train.dense_warmup_steps' linear warm-up)."""

from __future__ import annotations

import torch

DENSE_OPTIMIZERS = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
                    "sgd": torch.optim.SGD}

# Param-group key: the dense updates the optimizer has applied. In the group, so that its
# state_dict carries the count wherever the optimizer state goes (switching, checkpoints,
# rebuilt sync groups, OUT/model), and the warm-up goes on where it was.
UPDATES = "updates"


def make_dense_optimizer(name: str, params, lr: float,
                         weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """``weight_decay`` (train.dense_weight_decay): L2 added to the gradient, grad += wd * p
    (torch's weight_decay; for Adam that is L2, not AdamW's decoupled decay)."""
    if name not in DENSE_OPTIMIZERS:
        raise ValueError(f"train.dense_optimizer: unknown optimizer {name!r}; valid: "
                         f"{sorted(DENSE_OPTIMIZERS)}")
    return DENSE_OPTIMIZERS[name](params, lr=lr, weight_decay=weight_decay)


def import_optimizers(name: str) -> None:
    """Build a throw-away ``name`` optimizer: torch imports about 800 modules when a process
    builds its first one (1.7 s of CPU here). A process that may take over the dense
    parameters in a mode switch does this at start, not in the switch, where every worker
    would wait for it."""
    make_dense_optimizer(name, [torch.zeros(1, requires_grad=True)], lr=0.1)


def warmup_factor(updates: int, warmup_steps: int) -> float:
    """The learning-rate multiplier of the update that follows ``updates`` earlier ones:
    min(1, (k+1)/W), 1 without a warm-up (W = 0)."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (updates + 1) / warmup_steps)


def dense_updates(optimizer: torch.optim.Optimizer) -> int:
    """The updates ``optimizer`` has applied (0 for a state saved before they were counted)."""
    return int(optimizer.param_groups[0].get(UPDATES, 0))


def dense_step(optimizer: torch.optim.Optimizer, warmup_steps: int,
               lr_scale: float = 1.0) -> float:
    """One optimizer step (gradients in ``.grad``) at lr x ``lr_scale`` x the warm-up factor,
    and the update counted. Between steps the group holds the configured lr, so a state_dict
    taken at any time has it. Returns the multiplier applied."""
    groups = optimizer.param_groups
    scale = lr_scale * warmup_factor(dense_updates(optimizer), warmup_steps)
    base = [g["lr"] for g in groups]
    if scale != 1.0:
        for g, lr in zip(groups, base):
            g["lr"] = lr * scale
    try:
        optimizer.step()
    finally:
        for g, lr in zip(groups, base):
            g["lr"] = lr
    for g in groups:
        g[UPDATES] = g.get(UPDATES, 0) + 1
    return scale
