"""The local run (mode "local"): one process, the baseline every distributed mode is held to.

The step is the algorithm every mode distributes: pull the batch's rows, forward, loss,
backward, dense optimizer step, push the row gradients. Reading it top to bottom is reading the
algorithm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from recsync.config import ModelConfig, TrainConfig
from recsync.data.reader import Batch, Dataset
from recsync.embedding.lookup import LocalLookup
from recsync.embedding.row_optim import make_row_optimizer
from recsync.embedding.store import EmbeddingStore
from recsync.model import loss as model_loss
from recsync.model.optim import make_dense_optimizer
from recsync.model.registry import build_model, table_rows_for


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
    optimizer = make_dense_optimizer(train_cfg.dense_optimizer, dense.parameters(),
                                     train_cfg.dense_lr)
    return LocalModel(dense, LocalLookup(store), optimizer)


def train_step(m: LocalModel, batch: Batch) -> float:
    """One step on one batch; returns the batch's mean loss."""
    pulled = m.lookup.pull(batch.sparse)
    loss = model_loss.loss(m.dense, batch, pulled.embeddings())
    m.dense_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    m.dense_optimizer.step()
    m.lookup.push(pulled)
    return loss.item()


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
