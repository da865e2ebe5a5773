"""Wide & Deep (Cheng et al. 2016): logit = wide + deep, where wide is logistic regression
(1-dim tables ``<table>.linear`` and a linear layer on dense features) and deep an MLP over
concat(dense, every slot's embedding). No hand-made cross features in the wide part."""

from __future__ import annotations

import torch
from torch import nn

from recsync.model.inputs import ModelInputs, concat, feature_tables, slot_count, slot_dims
from recsync.model.layers import dense_linear, mlp, split_slots
from recsync.model.lr import linear_sum

LINEAR = ".linear"  # suffix of the 1-dim tables of a model's first-order part


def wide_deep_tables(inputs: ModelInputs):
    """The deep tables (one per data table), then the 1-dim ones (``<table>.linear``)."""
    return feature_tables(inputs) + feature_tables(inputs, dim=1, suffix=LINEAR)


class WideDeep(nn.Module):
    def __init__(self, num_dense: int, num_slots: int, embedding_width: int,
                 deep_mlp: list[int], dropout: float = 0.0, base_rate: float | None = None):
        super().__init__()
        self.num_slots = num_slots
        self.wide = dense_linear(num_dense, base_rate)  # its bias is the model's one bias
        self.deep = mlp([num_dense + embedding_width, *deep_mlp, 1], dropout=dropout, bias=False)

    def forward(self, dense: torch.Tensor, embeddings) -> torch.Tensor:
        """dense [B, num_dense], embeddings: the deep slots, then as many 1-dim slots -> [B]."""
        deep, linear = split_slots(embeddings, self.num_slots, "wide_deep")
        wide = self.wide(dense).squeeze(1) + linear_sum(linear)
        return wide + self.deep(torch.cat([dense, concat(deep)], dim=1)).squeeze(1)


def build_wide_deep(cfg, inputs: ModelInputs):
    tables = wide_deep_tables(inputs)
    deep = tables[:len(tables) // 2]
    module = WideDeep(inputs.num_dense, slot_count(inputs, deep), sum(slot_dims(inputs, deep)),
                      cfg.deep_mlp, dropout=cfg.dropout, base_rate=inputs.base_rate)
    return module, tables
