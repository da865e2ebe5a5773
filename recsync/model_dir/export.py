"""`recsync export`: a model directory as one self-contained file for serving, loadable with
torch alone (no recsync): TorchScript (``torch.jit.load``) or torch.export's program
(``torch.export.load``).

The file scores preprocessed rows: ``f(dense float32 [B, D], sparse int64 [B, T], values_0,
offsets_0, ...)`` -> click probabilities [B]. Every table is materialised in full (a row
training never touched is its initial value), so the file is as large as the tables; tables
beyond ``max_bytes`` are refused and stay in the model directory (docs/serving.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from recsync.data.format import Layout
from recsync.model.inputs import FeatureEmbeddings
from recsync.model_dir.trained import TrainedModel, load_model

FORMATS = ("torchscript", "torch-export")
DEFAULT_MAX_BYTES = 2 * 2**30


class ServingModel(nn.Module):
    """The dense module and the materialised tables, looked up as the run's LookupPlan does
    (one row per single-hot slot, ``embedding_bag`` sum/mean per multi-hot slot), in plain
    tensor operations that trace."""

    def __init__(self, model: TrainedModel):
        super().__init__()
        self.dense = model.dense.requires_grad_(False)  # served, never trained
        self.slots = [(s.table, s.column, s.multi, s.pooling) for s in model.plan.slots]
        self.one_dim = model.plan.one_dim
        self.num_multi = model.num_multi
        for t in range(len(model.specs)):
            self.register_buffer(f"table_{t}", model.materialise(t))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, *multi: torch.Tensor
                ) -> torch.Tensor:
        out = []
        for table, column, j, pooling in self.slots:
            weight = getattr(self, f"table_{table}")
            if j is None:
                out.append(weight.index_select(0, sparse[:, column]))
            else:
                values, offsets = multi[2 * j], multi[2 * j + 1]
                out.append(F.embedding_bag(values, weight, offsets[:-1], mode=pooling))
        embeddings = (FeatureEmbeddings.of(torch.stack(out, dim=1)) if self.one_dim
                      else FeatureEmbeddings(out))
        return torch.sigmoid(self.dense(dense, embeddings))


def table_bytes(model: TrainedModel) -> list[tuple[str, int]]:
    """Each table's materialised size in bytes (float32 rows x dim)."""
    return [(s.name, s.rows * s.dim * 4) for s in model.specs]


def check_size(model: TrainedModel, max_bytes: int) -> int:
    """The materialised tables' total bytes; ValueError naming the largest table where the
    total exceeds ``max_bytes``."""
    sizes = table_bytes(model)
    total = sum(b for _, b in sizes)
    if total > max_bytes:
        name, largest = max(sizes, key=lambda x: x[1])
        rows = next(s.rows for s in model.specs if s.name == name)
        raise ValueError(f"the tables would take {_gib(total)} materialised, over --max-bytes "
                         f"{_gib(max_bytes)}; the largest is table {name} ({rows:,} rows, "
                         f"{_gib(largest)}). Serve such a model from its directory "
                         f"(recsync.load_model), or raise --max-bytes if the file may be "
                         f"that large")
    return total


def _gib(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def example_inputs(model: TrainedModel, batch: int = 3) -> tuple[torch.Tensor, ...]:
    """A small batch of valid inputs (ids 0, multi-hot lists of different lengths)."""
    layout = Layout.from_meta(model.meta["data"])
    dense = torch.zeros(batch, len(layout.dense))
    sparse = torch.zeros(batch, len(layout.single), dtype=torch.int64)
    multi = []
    for _ in range(model.num_multi):
        lengths = torch.arange(batch) % 3 + 1
        offsets = torch.zeros(batch + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        multi += [torch.zeros(int(offsets[-1]), dtype=torch.int64), offsets]
    return (dense, sparse, *multi)


def export_model(model_dir: str | Path, out: str | Path, *, fmt: str = "torchscript",
                 max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """Write the model in ``model_dir`` to ``out`` as one file; returns {"path", "bytes",
    "tables_bytes", "seconds"}. ValueError: tables over ``max_bytes``, an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    begin = time.perf_counter()
    model = load_model(model_dir)
    total = check_size(model, max_bytes)
    serving = ServingModel(model).eval()
    args = example_inputs(model)
    out = Path(out)
    tmp = out.with_name(f".{out.stem}.tmp-{os.getpid()}{out.suffix}")
    try:
        with torch.no_grad():
            if fmt == "torchscript":
                torch.jit.save(torch.jit.trace(serving, args, check_trace=False), str(tmp))
            else:
                program = torch.export.export(serving, args,
                                              dynamic_shapes=_dynamic_shapes(model))
                torch.export.save(program, str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"path": str(out), "bytes": out.stat().st_size, "tables_bytes": total,
            "seconds": time.perf_counter() - begin}


def _dynamic_shapes(model: TrainedModel) -> tuple:
    """torch.export: the batch (and each multi-hot feature's id count) may vary."""
    batch = torch.export.Dim("batch", min=1)
    multi: list = []
    for j in range(model.num_multi):
        multi += [{0: torch.export.Dim(f"nnz_{j}", min=0)}, {0: batch + 1}]
    return ({0: batch}, {0: batch}, tuple(multi))  # forward(dense, sparse, *multi)
