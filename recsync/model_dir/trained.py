"""``recsync.load_model(DIR)``: a model directory as a torch module that scores.

The dense module is rebuilt from model.json's model config and data layout the way training
built it (model/setup.py), and its state loaded. Rows come from the saved trained rows; a row
training never touched is its initial value (embedding/store.py ``initial_rows`` with the saved
seed and scale), computed when asked for. Lookups go through the run's own ``LookupPlan`` and
``PulledBatch`` (single-hot, multi-hot sum/mean), so scores are the training process's.

Loading runs no code named by the directory: a built-in model is rebuilt by recsync; a user's
model (``model.name`` "module:builder" or "file.py:builder") only from the builder the CALLER
names (``load_model(path, builder=...)``), which is imported and run; model.json's name is
never imported. The model is first built on the meta device (nothing allocated) and checked
against the saved tensors, so model.json cannot make loading allocate more than its files hold.
"""

from __future__ import annotations

from itertools import zip_longest
from pathlib import Path

import numpy as np
import torch

from recsync.data.format import Layout
from recsync.data.reader import Batch
from recsync.embedding.store import initial_rows
from recsync.model.loss import logits
from recsync.model_dir.meta_fields import model_config, quoted
from recsync.model_dir.read import ModelDirError, ModelFiles, read_model_dir
from recsync.model_dir.write import MODEL_JSON
from recsync.safe_names import printable

MATERIALISE_ROWS = 1 << 20  # rows computed at a time when a whole table is materialised


class _DataLayout:
    """What model/inputs.py ``inputs_of`` reads of a data set, from model.json's data."""

    def __init__(self, data: dict):
        self.layout = Layout.from_meta(data)
        self._base_rate = data.get("base_rate")

    def base_rate(self, split: str = "train") -> float | None:
        return self._base_rate


def builder_for(name: str, builder: str | None, file: Path) -> str | None:
    """The user's builder to build model.json's ``model.name`` with: None for a built-in;
    ``builder`` (the caller's) for a user's model. ModelDirError where they do not go
    together: model.json alone never names code to run."""
    from recsync.model.registry import MODELS
    if name in MODELS:
        if builder is not None:
            raise ModelDirError(f"{file}: model.name = {name!r} is a built-in model, which "
                                f"recsync rebuilds itself: give no builder (got builder="
                                f"{quoted(builder)})")
        return None
    if ":" not in name:
        raise ModelDirError(f"{file}: model.name = {quoted(name)} is neither a built-in model "
                            f"of this recsync ({', '.join(sorted(MODELS))}) nor a user's "
                            f"builder")
    if builder is None:
        shown = printable(repr(name), 210)  # whole (names are at most 200 characters)
        raise ModelDirError(f"{file}: model.name = {shown} is a user's model; loading it runs "
                            f"that code, so a model directory alone never does: if you know "
                            f"and trust the model's code, name its builder yourself (builder= "
                            f"in Python, --builder on the command line)")
    if not isinstance(builder, str):
        raise TypeError(f"builder must be a string, \"package.module:builder\" or "
                        f"\"path/to/file.py:builder\", got {type(builder).__name__}")
    return builder


def check_fits(module: torch.nn.Module, state: dict[str, torch.Tensor], file: Path) -> None:
    """ModelDirError naming ``file`` and the first tensor unless ``state`` has exactly
    ``module``'s tensor names and shapes."""
    want = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    for key in sorted(want.keys() | got.keys()):
        if want.get(key) != got.get(key):
            raise ModelDirError(f"{file}: does not fit the model model.json describes: tensor "
                                f"{quoted(key)} is {got.get(key)} in the file, "
                                f"{want.get(key)} in the model")


def rebuild(meta: dict, where: Path, dense_state: dict[str, torch.Tensor],
            builder: str | None = None):
    """The model (model/setup.py BuiltModel) model.json describes, its tables and dense
    tensors checked against the saved ones. It is built on the meta device first, so a
    model.json describing a larger model than its files hold allocates nothing; a user's
    builder that cannot build there is checked after its real build instead."""
    from recsync.model.setup import model_for
    file = where / MODEL_JSON
    dense_file = where / meta["dense"]["file"]
    model_cfg = model_config(meta, file)
    use = builder_for(model_cfg.name, builder, file)
    try:
        layout = _DataLayout(meta["data"])
        try:
            with torch.device("meta"):
                sized = model_for(model_cfg, layout, builder=use).module
        except Exception:
            if use is None:
                raise
            sized = None
        if sized is not None:
            check_fits(sized, dense_state, dense_file)
        built = model_for(model_cfg, layout, builder=use)
    except ModelDirError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise ModelDirError(f"{file}: cannot rebuild the model "
                            f"({printable(str(e).strip(), 600)})") from None
    check_fits(built.module, dense_state, dense_file)
    saved = [(t["name"], t["rows"], t["dim"]) for t in meta["tables"]]
    built_tables = [(t.name, t.rows, t.dim) for t in built.tables]
    for i, (s, b) in enumerate(zip_longest(saved, built_tables)):
        if s != b:
            raise ModelDirError(f"{file}: tables[{i}] is {quoted(s)} (name, rows, dim), the "
                                f"model built from model.json has {quoted(b)}")
    return built


class IdBatch:
    """Preprocessed inputs as the plan reads a Batch: dense, sparse, (values, offsets) per
    multi-hot feature."""

    def __init__(self, dense: torch.Tensor, sparse: torch.Tensor, multi: tuple):
        self.dense, self.sparse, self.multi = dense, sparse, multi

    def __len__(self) -> int:
        return len(self.dense)


def saved_rows(known: torch.Tensor, values: torch.Tensor, spec, t: int, ids: torch.Tensor,
               seed: int, init_scale: float) -> torch.Tensor:
    """Rows ``ids`` (int64) of table ``t`` (``spec``) whose trained rows are ``values`` by
    ``known`` ids (ascending): trained ones as saved, others their initial values (zeros in a
    dynamic table)."""
    out = torch.empty(len(ids), spec.dim)
    if len(known):
        pos = torch.searchsorted(known, ids).clamp_max(len(known) - 1)
        found = known[pos] == ids
    else:
        pos = found = torch.zeros(len(ids), dtype=torch.bool)
    if bool(found.any()):
        out[found] = values[pos[found]]
    fresh = ~found
    if not bool(fresh.any()):
        return out
    if spec.dynamic is not None:  # an id without a row reads zeros, as in training
        out[fresh] = 0.0
    else:
        out[fresh] = initial_rows(seed, t, ids[fresh].contiguous(), spec.dim, init_scale)
    return out


class RowsLookup:
    """A lookup (``pull``, for recsync.metrics.evaluate) over trained rows held in memory
    (model_dir/write.py TrainedRows per table, e.g. gathered from a run's PS shards)."""

    def __init__(self, plan, specs: list, trained: list, seed: int, init_scale: float):
        self.plan, self.specs, self.seed, self.init_scale = plan, specs, seed, init_scale
        self.tables = [(torch.from_numpy(np.ascontiguousarray(r.ids, dtype=np.int64)),
                        torch.from_numpy(np.ascontiguousarray(r.rows, dtype=np.float32)))
                       for r in trained]

    def pull(self, batch, read_only: bool = True):
        tables = self.plan.dedup(batch)
        return self.plan.fuse(batch, tables, [
            saved_rows(*self.tables[t], self.specs[t], t, ids, self.seed, self.init_scale)
            for t, (ids, _) in enumerate(tables)])


class TrainedModel(torch.nn.Module):
    """A trained model loaded from its directory. ``forward(dense, sparse, values_0, offsets_0,
    ...)`` and ``score_batch`` give click probabilities; ``score(rows)`` preprocesses raw rows
    first. Also a lookup (``pull``) for recsync.metrics.evaluate."""

    def __init__(self, files: ModelFiles, builder: str | None = None):
        super().__init__()
        meta = self.meta = files.meta
        self.path = files.path
        built = rebuild(meta, files.path, files.dense_state, builder)
        self.dense = built.module
        try:
            self.dense.load_state_dict(files.dense_state)
        except RuntimeError as e:
            raise ModelDirError(f"{files.path / meta['dense']['file']}: does not fit the model "
                                f"({printable(str(e).strip(), 200)})") from None
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
        values (zeros in a dynamic table)."""
        return saved_rows(getattr(self, f"ids_{t}"), getattr(self, f"rows_{t}"), self.specs[t],
                          t, ids, self.seed, self.init_scale)

    def materialise(self, t: int) -> torch.Tensor:
        """Table ``t`` in full, [rows, dim] (every row, untouched ones at their initial
        values)."""
        spec = self.specs[t]
        if spec.dynamic is not None:
            raise ValueError(f"table {spec.name} is dynamic: its rows are keyed by 64-bit ids "
                             f"and have no full form (ids_{t} and rows_{t} hold what was "
                             f"trained)")
        out = torch.empty(spec.rows, spec.dim)
        for start in range(0, spec.rows, MATERIALISE_ROWS):
            stop = min(start + MATERIALISE_ROWS, spec.rows)
            out[start:stop] = initial_rows(self.seed, t, torch.arange(start, stop), spec.dim,
                                           self.init_scale)
        known = getattr(self, f"ids_{t}")
        if len(known):
            out[known] = getattr(self, f"rows_{t}")
        return out

    def pull(self, batch, read_only: bool = True):
        """The batch's rows as the training step sees them (embedding/lookup.py); a saved
        model only reads (``read_only`` is for evaluate's sake)."""
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


def load_model(path: str | Path, *, builder: str | None = None) -> TrainedModel:
    """The model in directory ``path`` (a run's OUT/model) as a TrainedModel; ModelDirError
    (a ValueError, one line naming the file) if it cannot be read.

    A built-in model loads without running code from anywhere. A user's model loads only with
    ``builder`` ("package.module:builder" or "path/to/file.py:builder", relative to the
    current directory), which is imported and run: pass it only for code you trust.
    model.json's ``model.params`` are given to it as data. It is called twice: on the meta
    device first, to size the model without allocating it (rebuild)."""
    return TrainedModel(read_model_dir(path), builder)
