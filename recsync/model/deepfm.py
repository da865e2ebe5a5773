"""DeepFM (Guo et al. 2017): logit = first order + FM second order + deep.

First order: 1-dim tables (``<table>.linear``) summed over the slots, plus a linear layer on
dense features (its bias is the model's one bias). Second order: the factorization machine's
Σ_{i<j} <e_i, e_j> over the slots, computed as ½ Σ_k ((Σ_i e_ik)² − Σ_i e_ik²). Deep: an MLP
over concat(dense, every slot's embedding). The FM needs one embedding dim for every table.
"""

from __future__ import annotations

import torch
from torch import nn

from recsync.model.inputs import ModelInputs, concat, slot_count, slot_dims, stack
from recsync.model.layers import dense_linear, mlp, split_slots
from recsync.model.lr import linear_sum
from recsync.model.wide_deep import wide_deep_tables


def fm_second_order(stacked: torch.Tensor) -> torch.Tensor:
    """Σ_{i<j} <e_i, e_j> for [B, slots, dim] -> [B], in O(slots·dim)."""
    total = stacked.sum(dim=1)
    return 0.5 * (total.square() - stacked.square().sum(dim=1)).sum(dim=1)


class DeepFM(nn.Module):
    def __init__(self, num_dense: int, num_slots: int, dim: int, deep_mlp: list[int],
                 dropout: float = 0.0, base_rate: float | None = None):
        super().__init__()
        self.num_slots = num_slots
        self.linear = dense_linear(num_dense, base_rate)  # its bias is the model's one bias
        self.deep = mlp([num_dense + num_slots * dim, *deep_mlp, 1], dropout=dropout,
                        bias=False)

    def forward(self, dense: torch.Tensor, embeddings) -> torch.Tensor:
        """dense [B, num_dense], embeddings: the deep slots, then as many 1-dim slots -> [B]."""
        deep, linear = split_slots(embeddings, self.num_slots, "deepfm")
        first = self.linear(dense).squeeze(1) + linear_sum(linear)
        e = stack(deep)
        return first + fm_second_order(e) + self.deep(
            torch.cat([dense, concat(e)], dim=1)).squeeze(1)


def build_deepfm(cfg, inputs: ModelInputs):
    tables = wide_deep_tables(inputs)
    deep = tables[:len(tables) // 2]
    dims = sorted(set(slot_dims(inputs, deep)))
    if len(dims) > 1:
        given = ", ".join(f"{t.name}={t.dim}" for t in deep)
        raise ValueError(f"model.name = \"deepfm\": its FM term needs one embedding dim for "
                         f"every table, the schema gives {given}; give every table one dim or "
                         f"use dcn or wide_deep")
    module = DeepFM(inputs.num_dense, slot_count(inputs, deep),
                    dims[0] if dims else inputs.embedding_dim, cfg.deep_mlp,
                    dropout=cfg.dropout, base_rate=inputs.base_rate)
    return module, tables
