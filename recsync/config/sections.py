"""The sections every run has: data, model, training, output, cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from recsync.config.base import Section


class DataConfig(Section):
    path: str = "runs/data/synth"
    """directory of a converted data set (`recsync data synth` / `recsync data criteo`)"""
    shuffle: bool = True
    """visit chunks, and rows within a chunk, in a seeded random order each epoch"""
    chunk_rows: int = Field(0, ge=0)
    """rows per unit of work (0: 16 batches); a chunk is a contiguous row range of one part"""


class ModelConfig(Section):
    name: str = "dlrm"
    """model: "dlrm" (DLRM with dot interaction) or "lr" (logistic regression, no interactions)"""
    embedding_dim: int = Field(16, ge=1)
    """width of every embedding row (dlrm); lr uses 1"""
    bottom_mlp: list[int] = [512, 256, 64]
    """hidden sizes of the bottom MLP over dense features (its output is embedding_dim wide)"""
    top_mlp: list[int] = [512, 256]
    """hidden sizes of the top MLP (its output is one logit)"""
    table_rows: int = Field(0, ge=0)
    """rows of every embedding table (0: each table as large as the data set says)"""
    embedding_init_scale: float = Field(0.15, gt=0)
    """embedding rows start uniform in [-scale, scale)"""

    @model_validator(mode="after")
    def _check_layers(self):
        for key in ("bottom_mlp", "top_mlp"):
            if any(n < 1 for n in getattr(self, key)):
                raise ValueError(f"{key}: layer sizes must be >= 1, got {getattr(self, key)}")
        return self


class TrainConfig(Section):
    batch_size: int = Field(4096, ge=1)
    """samples per step (per worker in distributed modes)"""
    epochs: int = Field(1, ge=1)
    """passes over the training split (CTR models are usually trained for one)"""
    max_steps: int = Field(0, ge=0)
    """stop after this many steps (0: no limit)"""
    embedding_optimizer: Literal["adagrad", "sgd"] = "adagrad"
    """row-wise optimizer of embedding rows"""
    embedding_lr: float = Field(0.2, gt=0)
    dense_optimizer: Literal["adagrad", "adam", "sgd"] = "adagrad"
    """optimizer of the dense (MLP) parameters"""
    dense_lr: float = Field(0.01, gt=0)
    seed: int = Field(0, ge=0)
    """seeds model init, embedding init and data order"""
    threads: int = Field(1, ge=1)
    """torch intra-op threads per training process"""
    eval_every_samples: int = Field(0, ge=0)
    """evaluate on eval_sample_rows every this many training samples (0: 8 times per run)"""
    eval_sample_rows: int = Field(50_000, ge=1)
    """rows of the eval split used by the evaluations during training"""
    eval_batch_size: int = Field(65_536, ge=1)


class OutputConfig(Section):
    log_every_steps: int = Field(20, ge=1)
    """steps per metrics.jsonl record"""
    progress: bool = True
    """show a progress bar on a terminal"""
    plot: bool = True
    """write training.png beside summary.json at the end"""


class ClusterConfig(Section):
    workers: int = Field(1, ge=1)
    """worker processes (Ray actors); ignored in local mode"""
    ps_shards: int = Field(1, ge=1)
    """parameter-server shards (Ray actors) holding the embedding rows"""
    address: str = ""
    """Ray cluster to join (e.g. "auto" or "10.0.0.1:6379"); empty: start a local Ray instance"""
    object_store_mb: int = Field(512, ge=64)
    """object store size of the embedded Ray instance"""
    push_window: int = Field(2, ge=1)
    """async: pushes a worker may have in flight before it waits for the oldest"""
