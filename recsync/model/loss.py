"""The one loss every mode trains with, and the forward pass that feeds it.

The model seam: a model maps (dense features [B, num_dense], looked-up embeddings, one per
slot: model/inputs.py) to logits [B]; the loss is the mean binary cross-entropy of those logits
against the labels (weighted by the rows' weights where the data set has them).
The local run, every mode's worker half and evaluation call these two functions, so a user's
own model or loss changes one place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from recsync.model.compute import compute_of


class ModelContractError(ValueError):
    """A model's forward broke the contract (logits [B], floating point): a user's model, not
    recsync, is at fault, so the one-line message is the whole story."""


def logits(model: torch.nn.Module, batch, embeddings: torch.Tensor,
           forward=None) -> torch.Tensor:
    """The model's logits [B] for ``batch`` (its dense features) and its looked-up rows;
    ModelContractError naming the model if its forward breaks the contract (a user's model may: a
    [B, 1] output would otherwise broadcast against the labels, integers would not train).
    ``forward``: what to call instead of ``model`` (its compiled form: model/compute.py)."""
    out = (model if forward is None else forward)(on_model(model, batch.dense), embeddings)
    rows = batch.dense.shape[0]
    if not isinstance(out, torch.Tensor) or out.shape != (rows,) or not out.is_floating_point():
        got = (f"a {out.dtype} tensor of shape {list(out.shape)}"
               if isinstance(out, torch.Tensor) else type(out).__name__)
        name = getattr(model, "recsync_model_name", type(model).__name__)
        raise ModelContractError(f"model.name = {name!r}: forward(dense, embeddings) returned "
                                 f"{got}; the contract is floating-point logits of shape [B] = "
                                 f"[{rows}] (recsync/model/inputs.py, docs/models.md)")
    return out


def loss(model: torch.nn.Module, batch, embeddings: torch.Tensor) -> torch.Tensor:
    """The batch's mean binary cross-entropy (with logits): a scalar to differentiate. The
    forward runs as ``prepare`` set the module up (model/compute.py: bfloat16 autocast,
    compiled); the loss is always computed from float32 logits."""
    compute = compute_of(model)
    with compute.autocast():
        out = logits(model, batch, embeddings, compute.forward)
    out = out.float()
    label = on_model(model, batch.label)
    weight = getattr(batch, "weight", None)
    if weight is None:
        return F.binary_cross_entropy_with_logits(out, label)
    weight = on_model(model, weight)
    per_row = F.binary_cross_entropy_with_logits(out, label, reduction="none")
    return (per_row * weight).sum() / weight.sum().clamp_min(1e-12)


def on_model(model: torch.nn.Module, t: torch.Tensor) -> torch.Tensor:
    """``t`` on the model's device (a GPU worker's: recsync/cluster/device.py); as it is on the
    CPU."""
    param = next(model.parameters(), None)
    if param is None or param.device == t.device:
        return t
    return t.to(param.device, non_blocking=True)
