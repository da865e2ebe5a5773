"""DLRM (Naumov et al. 2019): bottom MLP over dense features, pairwise dot interaction between
the dense vector and every slot's embedding, top MLP, one logit. Without dense features (Avazu)
there is no bottom MLP: the interaction is among the slots alone.

The module holds only dense parameters; embeddings arrive as an input (one [B, dim] per slot,
or one [B, slots, dim] tensor), looked up by whoever owns the rows.
"""

from __future__ import annotations

import torch
from torch import nn

from recsync.model.inputs import ModelInputs, feature_tables, slot_count, stack
from recsync.model.layers import init_output_bias, mlp


class DLRM(nn.Module):
    def __init__(self, num_dense: int, num_slots: int, dim: int, bottom_mlp: list[int],
                 top_mlp: list[int], dropout: float = 0.0, base_rate: float | None = None):
        super().__init__()
        self.bottom = mlp([num_dense, *bottom_mlp, dim], dropout=dropout,
                          final_activation=True) if num_dense else None
        num_vectors = num_slots + (1 if num_dense else 0)
        # strictly lower triangle of the (num_vectors x num_vectors) dot-product matrix
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=-1)
        self.register_buffer("tri_rows", rows, persistent=False)
        self.register_buffer("tri_cols", cols, persistent=False)
        self.top = mlp([(dim if num_dense else 0) + len(rows), *top_mlp, 1], dropout=dropout)
        init_output_bias(self.top[-1], base_rate)

    def forward(self, dense: torch.Tensor, embeddings) -> torch.Tensor:
        """dense [B, num_dense], embeddings (slots of [B, dim], or [B, slots, dim]) -> [B]."""
        vectors = stack(embeddings)                               # [B, S, dim]
        if self.bottom is not None:
            x = self.bottom(dense)
            vectors = torch.cat([x.unsqueeze(1), vectors], dim=1)  # [B, S+1, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))        # [B, S+1, S+1]
        pairs = dots[:, self.tri_rows, self.tri_cols]             # [B, (S+1)S/2]
        top_in = pairs if self.bottom is None else torch.cat([x, pairs], dim=1)
        return self.top(top_in).squeeze(1)


def build_dlrm(cfg, inputs: ModelInputs):
    """One table per data table; every table must have one dim (the dot interaction)."""
    tables = feature_tables(inputs)
    dims = sorted({t.dim for t in tables})
    if len(dims) > 1:
        given = ", ".join(f"{t.name}={t.dim}" for t in tables)
        raise ValueError(f"model.name = \"dlrm\": its dot interaction needs one embedding dim "
                         f"for every table, the schema gives {given}; give every table one dim "
                         f"or use dcn or wide_deep")
    dim = dims[0] if dims else inputs.embedding_dim
    slots = slot_count(inputs, tables)
    if slots + (1 if inputs.num_dense else 0) < 2:
        raise ValueError("model.name = \"dlrm\": its dot interaction needs two vectors at least "
                         f"(the data set has {inputs.num_dense} dense features and {slots} sparse)")
    module = DLRM(inputs.num_dense, slots, dim, cfg.bottom_mlp,
                  cfg.top_mlp, dropout=cfg.dropout, base_rate=inputs.base_rate)
    return module, tables
