"""DLRM (Naumov et al. 2019): bottom MLP over dense features, pairwise dot interaction between
the dense vector and every table's embedding, top MLP, one logit.

The module holds only dense parameters; embeddings arrive as an input ([B, tables, dim]), looked
up by whoever owns the rows.
"""

from __future__ import annotations

import torch
from torch import nn

from recsync.model.inputs import concat, stack


def mlp(sizes: list[int], *, final_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, num_dense: int, num_tables: int, dim: int, bottom_mlp: list[int],
                 top_mlp: list[int]):
        super().__init__()
        self.bottom = mlp([num_dense, *bottom_mlp, dim], final_activation=True)
        num_vectors = num_tables + 1
        # strictly lower triangle of the (num_vectors x num_vectors) dot-product matrix
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=-1)
        self.register_buffer("tri_rows", rows, persistent=False)
        self.register_buffer("tri_cols", cols, persistent=False)
        self.top = mlp([dim + len(rows), *top_mlp, 1], final_activation=False)

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor | list) -> torch.Tensor:
        """dense [B, num_dense], embeddings [B, T, dim] (or T tensors [B, dim]) -> logits [B]."""
        x = self.bottom(dense)
        vectors = torch.cat([x.unsqueeze(1), stack(embeddings)], dim=1)  # [B, T+1, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))        # [B, T+1, T+1]
        pairs = dots[:, self.tri_rows, self.tri_cols]             # [B, (T+1)T/2]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)


class LogisticRegression(nn.Module):
    """logit = w·dense + Σ_t e_t[id_t] + b, with 1-dim embeddings: no feature interactions."""

    def __init__(self, num_dense: int):
        super().__init__()
        self.linear = nn.Linear(num_dense, 1)

    def forward(self, dense: torch.Tensor, embeddings: torch.Tensor | list) -> torch.Tensor:
        return self.linear(dense).squeeze(1) + concat(embeddings).sum(dim=1)
