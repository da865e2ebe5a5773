"""Dense parameters and optimizer state between a worker's replica and the PS, for switching
between sync (a replica per worker, a torch optimizer over its parameters) and gba (one flat
vector on PS shard 0, a torch optimizer over that vector).

The optimizers in use (Adagrad, Adam, SGD) are element-wise, so an optimizer over the flat
vector with the state of each parameter flattened and concatenated in ``model.parameters()``
order takes exactly the steps the per-parameter one would. Plain functions, tested without Ray.
"""

from __future__ import annotations

import copy

import torch


def _is_per_element(value, numel: int) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.numel() == numel


def to_flat(optimizer_state: dict, shapes: list[torch.Size]) -> dict:
    """A per-parameter optimizer's ``state_dict()`` -> the state_dict of the same optimizer
    over one flat vector (per-element tensors concatenated, scalars such as ``step`` taken
    from the first parameter, which every step updates with the others)."""
    numels = [int(torch.Size(s).numel()) for s in shapes]
    state, groups = optimizer_state["state"], optimizer_state["param_groups"]
    if len(groups) != 1:
        raise ValueError(f"dense optimizer has {len(groups)} parameter groups; switching "
                         f"supports one")
    flat_state = {}
    if state:
        missing = [p for p in range(len(numels)) if p not in state]
        if missing:
            raise ValueError(f"optimizer state lacks parameters {missing}: every parameter "
                             f"must have taken the same steps")
        flat_state[0] = {k: (torch.cat([state[p][k].reshape(-1) for p in range(len(numels))])
                             if _is_per_element(v, numels[0]) else copy.deepcopy(v))
                         for k, v in state[0].items()}
    group = {**copy.deepcopy(groups[0]), "params": [0]}
    return {"state": flat_state, "param_groups": [group]}


def from_flat(flat_state: dict, shapes: list[torch.Size]) -> dict:
    """The inverse of ``to_flat``: a flat optimizer's state_dict -> the per-parameter one."""
    numels = [int(torch.Size(s).numel()) for s in shapes]
    state = {}
    if flat_state["state"]:
        flat, total, offset = flat_state["state"][0], sum(numels), 0
        for p, (shape, n) in enumerate(zip(shapes, numels)):
            state[p] = {k: (v[offset:offset + n].reshape(shape).clone()
                            if _is_per_element(v, total) else copy.deepcopy(v))
                        for k, v in flat.items()}
            offset += n
    group = {**copy.deepcopy(flat_state["param_groups"][0]), "params": list(range(len(shapes)))}
    return {"state": state, "param_groups": [group]}
