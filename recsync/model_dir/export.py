"""`recsync export`: a model directory as one self-contained file for serving, loadable with
torch alone (no recsync): TorchScript (``torch.jit.load``) or torch.export's program
(``torch.export.load``).

The file scores preprocessed rows: ``f(dense float32 [B, D], sparse int64 [B, T], values_0,
offsets_0, ...)`` -> click probabilities [B]. Every table is materialised in full (a row
training never touched is its initial value), so the file is as large as the tables; tables
beyond ``max_bytes`` are refused and stay in the model directory (docs/serving.md).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from recsync.data.format import Layout
from recsync.model.inputs import FeatureEmbeddings
from recsync.model_dir.outfile import check_output, remove_stale_temps, write_file
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
                out.append(F.embedding_bag(values, weight, offsets, mode=pooling,
                                           include_last_offset=True))
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
                 max_bytes: int = DEFAULT_MAX_BYTES, overwrite: bool = False,
                 builder: str | None = None) -> dict:
    """Write the model in ``model_dir`` to ``out`` as one file; returns {"path", "bytes",
    "tables_bytes", "seconds"}. ValueError: tables over ``max_bytes``, an unknown format, a
    model that does not export; FileExistsError: ``out`` exists and not ``overwrite``;
    OSError "cannot write OUT": the disk refused it (no file is left). ``builder``: a user's
    own model's builder, imported and run to rebuild it (recsync.load_model)."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    begin = time.perf_counter()
    out = check_output(out, overwrite=overwrite, inputs=[model_dir])
    model = load_model(model_dir, **({"builder": builder} if builder is not None else {}))
    dynamic = [s.name for s in model.specs if s.dynamic is not None]
    if dynamic:
        shown = ", ".join(dynamic[:3]) + (", ..." if len(dynamic) > 3 else "")
        raise ValueError(f"{model_dir}: {len(dynamic)} of its tables ({shown}) are dynamic (rows "
                         f"keyed by 64-bit ids), which export does not write yet; serve the "
                         f"model from its directory (recsync.load_model, recsync predict)")
    total = check_size(model, max_bytes)
    serving = ServingModel(model).eval()
    args = example_inputs(model)
    try:
        with torch.no_grad():
            if fmt == "torchscript":
                program = torch.jit.trace(serving, args, check_trace=False)
            else:
                with _no_size_specialization():
                    program = torch.export.export(serving, args,
                                                  dynamic_shapes=_dynamic_shapes(model))
    except Exception as e:  # noqa: BLE001 - torch's tracing errors span many types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{model_dir}: --format {fmt} cannot export this model "
                         f"({type(e).__name__}: {first})") from None
    remove_stale_temps(out)
    size = write_file(out, lambda f: _save(program, fmt, f), overwrite=overwrite)
    return {"path": str(out), "bytes": size, "tables_bytes": total,
            "seconds": time.perf_counter() - begin}


def _save(program, fmt: str, file) -> None:
    if fmt == "torchscript":
        torch.jit.save(program, file)
        return
    with warnings.catch_warnings():  # about weights on a GPU; these are all on the CPU
        warnings.filterwarnings("ignore", message="No complete tensor found")
        torch.export.save(program, file)


def _no_size_specialization():
    """torch.export's option (experimental in torch 2.13, its export tutorial) not to assume
    that a traced size is 0/1 or >= 2: without it embedding_bag's meta kernel guards the batch
    to >= 2, and a multi-hot model's program refuses one row."""
    try:
        from torch.fx.experimental import _config as config
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(config, "backed_size_oblivious"):
        return contextlib.nullcontext()
    return config.patch(backed_size_oblivious=True)


def _dynamic_shapes(model: TrainedModel) -> tuple:
    """torch.export: the batch (and each multi-hot feature's id count) may vary. ``*multi``
    takes one entry (a tuple of its tensors' shapes) only where the model has multi-hot
    features: an empty ``*multi`` is no input to torch.export."""
    batch = torch.export.Dim("batch", min=1)
    multi: list = []
    for j in range(model.num_multi):
        multi += [{0: torch.export.Dim(f"nnz_{j}", min=0)}, {0: batch + 1}]
    shapes = ({0: batch}, {0: batch})  # forward(dense, sparse, *multi)
    return (*shapes, tuple(multi)) if multi else shapes
