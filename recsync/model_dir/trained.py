"""``recsync.load_model(DIR)``: a model directory as a torch module that scores.

The dense module is rebuilt from model.json's model config and data layout the way training
built it (model/setup.py), and its state loaded. Rows come from the saved trained rows; a row
training never touched is its initial value (embedding/store.py ``initial_rows`` with the saved
seed and scale), computed when asked for. Lookups go through the run's own ``LookupPlan`` and
``PulledBatch`` (single-hot, multi-hot sum/mean), so scores are the training process's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recsync.data.format import Layout
from recsync.data.reader import Batch
from recsync.embedding.store import initial_rows
from recsync.model.loss import logits
from recsync.model_dir.read import ModelDirError, ModelFiles, read_model_dir
from recsync.model_dir.write import MODEL_JSON

MATERIALISE_ROWS = 1 << 20  # rows computed at a time when a whole table is materialised


class _DataLayout:
    """What model/inputs.py ``inputs_of`` reads of a data set, from model.json's data."""

    def __init__(self, data: dict):
        self.layout = Layout.from_meta(data)
        self._base_rate = data.get("base_rate")

    def base_rate(self, split: str = "train") -> float | None:
        return self._base_rate


def rebuild(meta: dict, where: Path):
    """The model (model/setup.py BuiltModel) model.json describes, its tables checked."""
    from recsync.config import ModelConfig
    from recsync.model.setup import model_for
    file = where / MODEL_JSON
    try:
        model_cfg = ModelConfig.model_validate(meta["model"])
        built = model_for(model_cfg, _DataLayout(meta["data"]))
    except (ValueError, KeyError, TypeError) as e:
        raise ModelDirError(f"{file}: cannot rebuild the model ({str(e).splitlines()[0]})"
                            ) from None
    saved = [(t["name"], t["rows"], t["dim"]) for t in meta["tables"]]
    built_tables = [(t.name, t.rows, t.dim) for t in built.tables]
    if saved != built_tables:
        raise ModelDirError(f"{file}: tables {saved} do not match the model's {built_tables}")
    return built


class IdBatch:
    """Preprocessed inputs as the plan reads a Batch: dense, sparse, (values, offsets) per
    multi-hot feature."""

    def __init__(self, dense: torch.Tensor, sparse: torch.Tensor, multi: tuple):
        self.dense, self.sparse, self.multi = dense, sparse, multi

    def __len__(self) -> int:
        return len(self.dense)


class TrainedModel(torch.nn.Module):
    """A trained model loaded from its directory. ``forward(dense, sparse, values_0, offsets_0,
    ...)`` and ``score_batch`` give click probabilities; ``score(rows)`` preprocesses raw rows
    first. Also a lookup (``pull``) for recsync.evaluate."""

    def __init__(self, files: ModelFiles):
        super().__init__()
        meta = self.meta = files.meta
        self.path = files.path
        built = rebuild(meta, files.path)
        self.dense = built.module
        try:
            self.dense.load_state_dict(files.dense_state)
        except RuntimeError as e:
            raise ModelDirError(f"{files.path / meta['dense'].get('file', 'dense')}: does not "
                                f"fit the model ({str(e).splitlines()[0]})") from None
        self.dense.eval()
        self.plan, self.specs = built.plan, built.tables
        self.seed = int(meta["train"]["seed"])
        self.init_scale = float(meta["train"]["embedding_init_scale"])
        self.num_multi = len(built.inputs.features) - sum(
            1 for f in built.inputs.features if f.pooling is None)
        for t, (ids, rows, _) in enumerate(files.tables):
            self.register_buffer(f"ids_{t}", ids)
            self.register_buffer(f"rows_{t}", rows)

    def table_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int64) of table ``t``: trained ones as saved, others their initial
        values."""
        known, values = getattr(self, f"ids_{t}"), getattr(self, f"rows_{t}")
        spec = self.specs[t]
        out = torch.empty(len(ids), spec.dim)
        if len(known):
            pos = torch.searchsorted(known, ids).clamp_max(len(known) - 1)
            found = known[pos] == ids
        else:
            pos = found = torch.zeros(len(ids), dtype=torch.bool)
        if bool(found.any()):
            out[found] = values[pos[found]]
        fresh = ~found
        if bool(fresh.any()):
            out[fresh] = initial_rows(self.seed, t, ids[fresh].contiguous(), spec.dim,
                                      self.init_scale)
        return out

    def materialise(self, t: int) -> torch.Tensor:
        """Table ``t`` in full, [rows, dim] (every row, untouched ones at their initial
        values)."""
        spec = self.specs[t]
        out = torch.empty(spec.rows, spec.dim)
        for start in range(0, spec.rows, MATERIALISE_ROWS):
            stop = min(start + MATERIALISE_ROWS, spec.rows)
            out[start:stop] = initial_rows(self.seed, t, torch.arange(start, stop), spec.dim,
                                           self.init_scale)
        known = getattr(self, f"ids_{t}")
        if len(known):
            out[known] = getattr(self, f"rows_{t}")
        return out

    def pull(self, batch):
        """The batch's rows as the training step sees them (embedding/lookup.py)."""
        tables = self.plan.dedup(batch)
        return self.plan.fuse(batch, tables, [self.table_rows(t, ids)
                                              for t, (ids, _) in enumerate(tables)])

    @torch.no_grad()
    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, *multi: torch.Tensor
                ) -> torch.Tensor:
        """Click probabilities [B] of preprocessed rows: dense float32 [B, D], sparse int64
        [B, single-hot features], then per multi-hot feature its values int64 [nnz] and
        offsets int64 [B + 1]."""
        if len(multi) != 2 * self.num_multi:
            raise ValueError(f"this model takes {self.num_multi} multi-hot feature(s): give "
                             f"values and offsets for each ({len(multi)} tensors given)")
        pairs = tuple((multi[2 * j], multi[2 * j + 1]) for j in range(self.num_multi))
        batch = IdBatch(dense.float(), sparse.long(), pairs)
        return torch.sigmoid(logits(self.dense, batch, self.pull(batch).embeddings()))

    def score_batch(self, batch: Batch) -> np.ndarray:
        """Click probabilities (float32 [B]) of a data set's batch (recsync.data.reader)."""
        with torch.no_grad():
            return torch.sigmoid(logits(self.dense, batch, self.pull(batch).embeddings())
                                 ).numpy()

    def score(self, rows, *, source: str = "<rows>") -> np.ndarray:
        """Click probabilities of raw rows (a pyarrow Table, a pandas DataFrame or a dict of
        columns), preprocessed as the training data was (recsync.data.rows)."""
        import pyarrow as pa
        preprocess_table = raw_rows_preprocessor()
        if isinstance(rows, dict):
            table = pa.table(rows)
        elif isinstance(rows, pa.Table):
            table = rows
        else:
            table = pa.Table.from_pandas(rows, preserve_index=False)
        return self.score_batch(preprocess_table(table, self.meta["data"], source=source))


def raw_rows_preprocessor():
    """recsync.data.rows.preprocess_table, or a clear error where this recsync lacks it."""
    try:
        from recsync.data.rows import preprocess_table
    except ImportError:
        raise NotImplementedError("scoring raw rows needs recsync.data.rows.preprocess_table, "
                                  "which this recsync does not have yet; score a converted "
                                  "data set (score_batch, `recsync predict DATA_DIR`) instead"
                                  ) from None
    return preprocess_table


def load_model(path: str | Path) -> TrainedModel:
    """The model in directory ``path`` (a run's OUT/model) as a TrainedModel; ModelDirError
    (a ValueError, one line naming the file) if it cannot be read."""
    return TrainedModel(read_model_dir(path))
