"""DCN-v2 (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network"), the stacked form:
x0 = concat(dense, every slot's embedding); ``cross_layers`` full-rank cross layers
x_{l+1} = x0 * (W_l x_l + b_l) + x_l; a deep MLP over the cross output; a linear head."""

from __future__ import annotations

import torch
from torch import nn

from recsync.model.inputs import ModelInputs, concat, feature_tables, slot_dims
from recsync.model.layers import init_output_bias, mlp


class CrossNetwork(nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x
        return x


class DCN(nn.Module):
    def __init__(self, num_dense: int, embedding_width: int, cross_layers: int,
                 deep_mlp: list[int], dropout: float = 0.0, base_rate: float | None = None):
        super().__init__()
        width = num_dense + embedding_width
        self.cross = CrossNetwork(width, cross_layers)
        self.deep = mlp([width, *deep_mlp, 1], dropout=dropout)  # its last layer: the head
        init_output_bias(self.deep[-1], base_rate)

    def forward(self, dense: torch.Tensor, embeddings) -> torch.Tensor:
        """dense [B, num_dense], embeddings (slots of [B, dim], or [B, slots, dim]) -> [B]."""
        x0 = torch.cat([dense, concat(embeddings)], dim=1)
        return self.deep(self.cross(x0)).squeeze(1)


def build_dcn(cfg, inputs: ModelInputs):
    """One table per data table (dims may differ: the cross network sees their concatenation)."""
    tables = feature_tables(inputs)
    module = DCN(inputs.num_dense, sum(slot_dims(inputs, tables)), cfg.cross_layers,
                 cfg.deep_mlp, dropout=cfg.dropout, base_rate=inputs.base_rate)
    return module, tables
