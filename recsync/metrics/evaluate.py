"""AUC, log loss, NE and calibration (recsync/metrics/core.py) of a trained model on the eval
split or the validation slice: the local run's model, or a distributed run's dense parameters
with its rows served by the PS."""

from __future__ import annotations

import numpy as np
import torch

from recsync.data.reader import Chunk, Dataset
from recsync.metrics.core import auc_logloss
from recsync.model.loss import logits


@torch.no_grad()
def evaluate(dense: torch.nn.Module, lookup, ds: Dataset, rows: int, batch_size: int,
             keep_scores: bool = False, split: str = "eval") -> dict:
    """AUC, log loss, NE and calibration (weighted where the data has weights) on the first
    ``rows`` rows of ``split`` (all of it if larger): the eval split, or "validation", the
    slice held out of the training split (data/holdout.py). ``lookup`` serves the rows
    (``pull(batch, read_only) -> PulledBatch``): LocalLookup or PSClient; its pulls are
    read-only, so an evaluation never admits, evicts or scores a dynamic table's rows.
    ``keep_scores``: the result also holds the arrays the metrics were computed from, in
    split order: "scores" (float32 probabilities), "labels" and, where the data has
    weights, "weights" (for OUT/predictions.parquet)."""
    dense.eval()
    labels, probs, weights, seen = [], [], [], 0
    for whole in ds.chunks(split, max(1, rows)):
        if seen >= rows:
            break
        chunk = Chunk(whole.split, whole.part, whole.start,
                      whole.start + min(whole.rows, rows - seen))
        for batch in ds.batches(chunk, batch_size):
            pulled = lookup.pull(batch, read_only=True)  # a dynamic table stays as it is
            probs.append(torch.sigmoid(logits(dense, batch, pulled.embeddings())).numpy())
            labels.append(batch.label.numpy())
            if batch.weight is not None:
                weights.append(batch.weight.numpy())
        seen += chunk.rows
    dense.train()
    if not labels:
        result = auc_logloss(np.empty(0), np.empty(0))
        scores, label, weight = (np.zeros(0, np.float32), np.zeros(0, np.float32),
                                 np.zeros(0, np.float32) if ds.layout.weight else None)
    else:
        scores, label = np.concatenate(probs), np.concatenate(labels)
        weight = np.concatenate(weights) if weights else None
        result = auc_logloss(label, scores, weight)
    if keep_scores:
        result.update(scores=scores.astype(np.float32, copy=False), labels=label)
        if weight is not None:
            result["weights"] = weight
    return result
