"""The driver's own copy of the model: the dense module, the tables and the embedding plan,
and the model directory a warm start reads (run/warm_start.py). The driver builds it once, seeds
the first workers and shard 0 from it, and loads the trained parameters into it at the end."""

from __future__ import annotations

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from recsync.model.setup import model_for
from recsync.run import warm_start


class DriverModel:
    """The model as the driver holds it (``warm``: the model directory the run starts from,
    if any)."""

    def __init__(self, cfg, ds, warm=None):
        torch.manual_seed(cfg.train.seed)
        built = model_for(cfg.model, ds)
        self.dense_model, self.tables, self.plan = built.module, built.tables, built.plan
        self.warm = warm
        if warm is not None:  # shard 0 (and EASGD's center) start from its dense parameters
            self.dense_model.load_state_dict(warm.dense_state)

    def initial_dense(self) -> np.ndarray:
        return parameters_to_vector(self.dense_model.parameters()).detach().numpy().copy()

    def start_dense(self, cfg, dense_on_ps: bool) -> dict | None:
        """The dense state the first workers start from where they hold it (not
        ``dense_on_ps``): a warm start's parameters and optimizer state (flat layout); None:
        the model's initial values."""
        if self.warm is None or dense_on_ps:
            return None
        return {"params": self.initial_dense(), "optimizer": warm_start.flat_optimizer_state(
            self.warm, cfg, len(self.initial_dense()))}
