"""A model of your own, behind recsync's model contract (recsync/model/inputs.py): attention
pooling. A learned query attends over the feature slots' embeddings; the pooled vector and the
dense features go through a small MLP to one logit.

Train it with (docs/models.md)::

    recsync train --set 'model.name="examples/user_model.py:build"' \
        --set model.params.hidden=64 --out runs/attention

The builder returns only the module, so recsync gives it one table per data table
(``feature_tables(inputs)``); every table must then have one dim (``stack`` says so if not).
"""

import torch
from torch import nn

from recsync.model.inputs import ModelInputs, stack


class AttentionPooling(nn.Module):
    def __init__(self, num_dense: int, dim: int, hidden: int):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(dim))
        self.key = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(num_dense + dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, dense: torch.Tensor, embeddings) -> torch.Tensor:
        e = stack(embeddings)                                      # [B, slots, dim]
        weights = torch.softmax(self.key(e) @ self.query, dim=1)   # [B, slots]
        pooled = (weights.unsqueeze(2) * e).sum(dim=1)             # [B, dim]
        return self.mlp(torch.cat([dense, pooled], dim=1)).squeeze(1)


def build(inputs: ModelInputs, hidden: int = 64) -> nn.Module:
    dims = {t.dim or inputs.embedding_dim for t in inputs.used_tables()}
    return AttentionPooling(inputs.num_dense, max(dims, default=inputs.embedding_dim), hidden)
