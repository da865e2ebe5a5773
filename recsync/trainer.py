"""The single-process trainer (mode "local"): the baseline every distributed mode is held to.

The step is the one the distributed modes reuse: pull the batch's rows, forward, backward,
dense optimizer step, push the row gradients. Reading it top to bottom is reading the algorithm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from recsync.config import ModelConfig, TrainConfig
from recsync.data.reader import Batch, Chunk, Dataset
from recsync.embedding.lookup import LocalLookup
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.store import EmbeddingStore
from recsync.metrics import auc_logloss
from recsync.model.registry import build_model

DENSE_OPTIMIZERS = {"adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam,
                    "sgd": torch.optim.SGD}


def table_rows_for(model_cfg: ModelConfig, data_rows: list[int]) -> list[int]:
    """Each table's rows: the data set's, or model.table_rows if set (never fewer than the data's)."""
    if model_cfg.table_rows == 0:
        return list(data_rows)
    if model_cfg.table_rows < max(data_rows):
        raise ValueError(f"model.table_rows = {model_cfg.table_rows} is smaller than the data "
                         f"set's largest table ({max(data_rows)} rows): ids would not fit")
    return [model_cfg.table_rows] * len(data_rows)


@dataclass
class LocalModel:
    """A model with its rows served from this process."""

    dense: torch.nn.Module
    lookup: LocalLookup
    dense_optimizer: torch.optim.Optimizer


def build_local_model(model_cfg: ModelConfig, train_cfg: TrainConfig, ds: Dataset) -> LocalModel:
    torch.manual_seed(train_cfg.seed)
    dense, tables = build_model(model_cfg, ds.meta["num_dense"], ds.table_names,
                                table_rows_for(model_cfg, ds.table_rows))
    row_optimizer = make_row_optimizer(train_cfg.embedding_optimizer, train_cfg.embedding_lr)
    store = EmbeddingStore(tables, row_optimizer, seed=train_cfg.seed,
                           init_scale=model_cfg.embedding_init_scale)
    optimizer = DENSE_OPTIMIZERS[train_cfg.dense_optimizer](dense.parameters(),
                                                            lr=train_cfg.dense_lr)
    return LocalModel(dense, LocalLookup(store), optimizer)


def train_step(m: LocalModel, batch: Batch) -> float:
    """One step on one batch; returns the batch's mean loss."""
    pulled = m.lookup.pull(batch.sparse)
    logits = m.dense(batch.dense, pulled.embeddings())
    loss = F.binary_cross_entropy_with_logits(logits, batch.label)
    m.dense_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    m.dense_optimizer.step()
    m.lookup.push(pulled)
    return loss.item()


@torch.no_grad()
def evaluate(m: LocalModel, ds: Dataset, rows: int, batch_size: int) -> dict:
    """AUC and log loss on the first ``rows`` rows of the eval split (all of it if larger)."""
    m.dense.eval()
    labels, probs, seen = [], [], 0
    for p, info in enumerate(ds.meta["splits"]["eval"]["parts"]):
        if seen >= rows:
            break
        chunk = Chunk("eval", p, 0, min(info["rows"], rows - seen))
        for batch in ds.batches(chunk, batch_size):
            pulled = m.lookup.pull(batch.sparse)
            probs.append(torch.sigmoid(m.dense(batch.dense, pulled.embeddings())).numpy())
            labels.append(batch.label.numpy())
        seen += chunk.rows
    m.dense.train()
    if not labels:
        return {"auc": float("nan"), "logloss": float("nan"), "rows": 0}
    return auc_logloss(np.concatenate(labels), np.concatenate(probs))


class StepTimer:
    """Wall time per step over a logging interval."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.start, self.steps, self.samples, self.loss_sum = time.perf_counter(), 0, 0, 0.0

    def add(self, samples: int, loss: float):
        self.steps += 1
        self.samples += samples
        self.loss_sum += loss * samples
