"""AUC, log loss, NE and calibration (recsync/metrics.py) of a trained model on the eval
split: the local run's model, or a distributed run's dense parameters with its rows served by
the PS."""

from __future__ import annotations

import numpy as np
import torch

from recsync.data.reader import Chunk, Dataset
from recsync.metrics import auc_logloss
from recsync.model.loss import logits


@torch.no_grad()
def evaluate(dense: torch.nn.Module, lookup, ds: Dataset, rows: int, batch_size: int) -> dict:
    """AUC, log loss, NE and calibration (weighted where the data has weights) on the first
    ``rows`` rows of the eval split (all of it if larger).
    ``lookup`` serves the rows (``pull(batch) -> PulledBatch``): LocalLookup or PSClient."""
    dense.eval()
    labels, probs, weights, seen = [], [], [], 0
    for p, info in enumerate(ds.meta["splits"]["eval"]["parts"]):
        if seen >= rows:
            break
        chunk = Chunk("eval", p, 0, min(info["rows"], rows - seen))
        for batch in ds.batches(chunk, batch_size):
            pulled = lookup.pull(batch)
            probs.append(torch.sigmoid(logits(dense, batch, pulled.embeddings())).numpy())
            labels.append(batch.label.numpy())
            if batch.weight is not None:
                weights.append(batch.weight.numpy())
        seen += chunk.rows
    dense.train()
    if not labels:
        return auc_logloss(np.empty(0), np.empty(0))
    return auc_logloss(np.concatenate(labels), np.concatenate(probs),
                       np.concatenate(weights) if weights else None)
