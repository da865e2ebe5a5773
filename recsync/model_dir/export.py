"""`recsync export`: a model directory as one self-contained file for serving, loadable with
torch alone (no recsync): TorchScript (``torch.jit.load``) or torch.export's program
(``torch.export.load``).

The file scores preprocessed rows: ``f(dense float32 [B, D], sparse int64 [B, T], values_0,
offsets_0, ...)`` -> click probabilities [B]. A fixed table is materialised in full (a row
training never touched is its initial value), so the file is as large as those tables; a
dynamic table holds its trained rows and their ids, sorted, and the program looks each id up
itself (an id training gave no row reads zeros, as in training). Tables beyond ``max_bytes``
are refused and stay in the model directory (docs/serving.md).
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
ID_SENTINEL = 2**63 - 1  # ends a dynamic table's ids in the file (ServingModel)


class ServingModel(nn.Module):
    """The dense module and the tables, looked up as the run's LookupPlan does (one row per
    single-hot slot, ``embedding_bag`` sum/mean per multi-hot slot), in plain tensor operations
    that trace. Buffers: ``table_T``, a fixed table's rows [rows, dim] (row = id); for a
    dynamic table ``ids_T``, its n trained ids ascending then the sentinel 2^63 - 1 [n + 1],
    and ``table_T``, their rows then a row of zeros [n + 1, dim] (``dynamic_index``)."""

    def __init__(self, model: TrainedModel):
        super().__init__()
        self.dense = model.dense.requires_grad_(False)  # served, never trained
        self.slots = [(s.table, s.column, s.multi, s.pooling) for s in model.plan.slots]
        self.one_dim = model.plan.one_dim
        self.num_multi = model.num_multi
        self.dynamic = [s.dynamic is not None for s in model.specs]
        for t, dynamic in enumerate(self.dynamic):
            if not dynamic:
                self.register_buffer(f"table_{t}", model.materialise(t))
                continue
            ids, rows = getattr(model, f"ids_{t}"), getattr(model, f"rows_{t}")
            self.register_buffer(f"ids_{t}", torch.cat([ids, ids.new_tensor([ID_SENTINEL])]))
            self.register_buffer(f"table_{t}", torch.cat([rows, rows.new_zeros(1, rows.shape[1])]))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor, *multi: torch.Tensor
                ) -> torch.Tensor:
        out = []
        for table, column, j, pooling in self.slots:
            weight = getattr(self, f"table_{table}")
            ids = sparse[:, column] if j is None else multi[2 * j]
            if self.dynamic[table]:
                ids = dynamic_index(getattr(self, f"ids_{table}"), ids)
            if j is None:
                out.append(weight.index_select(0, ids))
            else:
                out.append(F.embedding_bag(ids, weight, multi[2 * j + 1], mode=pooling,
                                           include_last_offset=True))
        embeddings = (FeatureEmbeddings.of(torch.stack(out, dim=1)) if self.one_dim
                      else FeatureEmbeddings(out))
        return torch.sigmoid(self.dense(dense, embeddings))


def dynamic_index(known: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each id's row in a dynamic table's ``table_T``: its position in ``known`` (the trained
    ids ascending, then ID_SENTINEL) where it is there, else the last row (zeros). The sentinel
    bounds the search (no id sorts past it), so an id above every trained one, an empty table
    and the id 2^63 - 1 itself (trained: the first of two equal keys; untrained: the zero row)
    need no other case. ``ids`` are copied contiguous first (a single-hot feature's column is
    strided): searchsorted would warn, and ``contiguous()`` makes torch.export guard the batch
    to be > 1."""
    pos = torch.searchsorted(known, ids.clone(memory_format=torch.contiguous_format))
    return torch.where(known[pos] == ids, pos, known.shape[0] - 1)


def table_bytes(model: TrainedModel) -> list[tuple[str, str, int]]:
    """Each table's size in the file: (name, its rows in words, bytes). A fixed table is
    materialised (float32 rows x dim), a dynamic one holds its trained rows, their int64 ids
    and the sentinel's id and zero row."""
    out = []
    for t, s in enumerate(model.specs):
        if s.dynamic is None:
            out.append((s.name, f"{s.rows:,} rows", s.rows * s.dim * 4))
        else:
            n = len(getattr(model, f"ids_{t}"))
            out.append((s.name, f"{n:,} trained rows and their ids", (n + 1) * (s.dim * 4 + 8)))
    return out


def check_size(model: TrainedModel, max_bytes: int) -> int:
    """The tables' total bytes in the file; ValueError naming the largest table where the
    total exceeds ``max_bytes``."""
    sizes = table_bytes(model)
    total = sum(b for _, _, b in sizes)
    if total > max_bytes:
        name, rows, largest = max(sizes, key=lambda x: x[2])
        raise ValueError(f"the tables would take {_gib(total)} in the file, over --max-bytes "
                         f"{_gib(max_bytes)}; the largest is table {name} ({rows}, "
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
