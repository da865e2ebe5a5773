"""Logistic regression: logit = w·dense + b + Σ_slots e[id], with 1-dim embedding tables (no
feature interactions). The baseline every other model must beat (docs/design.md §10)."""

from __future__ import annotations

import torch
from torch import nn

from recsync.model.inputs import ModelInputs, concat, feature_tables
from recsync.model.layers import dense_linear


def linear_sum(embeddings) -> torch.Tensor:
    """Σ over slots of 1-dim embeddings: [B]."""
    return concat(embeddings).sum(dim=1)


class LogisticRegression(nn.Module):
    def __init__(self, num_dense: int, base_rate: float | None = None):
        super().__init__()
        self.linear = dense_linear(num_dense, base_rate)  # its bias is the model's one bias

    def forward(self, dense: torch.Tensor, embeddings) -> torch.Tensor:
        """dense [B, num_dense], embeddings (slots of [B, 1], or [B, slots, 1]) -> [B]."""
        return self.linear(dense).squeeze(1) + linear_sum(embeddings)


def build_lr(cfg, inputs: ModelInputs):
    """One 1-dim table per data table, named as the data table."""
    return LogisticRegression(inputs.num_dense, inputs.base_rate), feature_tables(inputs, dim=1)
