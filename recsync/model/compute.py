"""How a process runs its dense model's training steps: the precision of the forward and
backward (``train.dense_precision``) and whether the forward is compiled (``train.compile``).

``prepare`` attaches a ``DenseCompute`` to the module (``COMPUTE_ATTR``) in every process that
trains it (the local run, each worker); ``model/loss.py``'s ``loss`` reads it, so every mode's
step gets it with no code of its own. Only training steps use it: evaluation and ``predict``
call the plain module in float32 (``logits``), so a run's AUC and saved scores are those of the
float32 model it saves.

bfloat16 is autocast (``torch.autocast``): the parameters, the embedding rows, their gradients
(the ones pushed to the PS) and the optimizers' state stay float32; matrix products run in
bfloat16, and the loss is computed from float32 logits. Where the CPU has no native bfloat16
(AVX512-BF16 or AMX), autocast would be emulated and slower, so "auto" means float32 there and
an explicit "bfloat16" falls back to float32 with a logged warning (a worker on another node
may have another CPU: failing it mid-run would be worse than running it slower-but-exact).

``torch.compile`` compiles the forward on its first call; ``warm_up`` makes that call (forward
and backward on zero rows, no optimizer step) before training starts, so that the compile time
is start-up, never training throughput.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

log = logging.getLogger(__name__)

COMPUTE_ATTR = "recsync_compute"  # set on the module by prepare(); read by model/loss.py


def cpu_has_bf16() -> bool:
    """Whether this CPU runs bfloat16 natively (oneDNN's check: AVX512-BF16 or AMX)."""
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


def device_has_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 natively (a CUDA device: torch's own check)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu_has_bf16()


def resolve_precision(setting: str, device: torch.device) -> tuple[str, str | None]:
    """``train.dense_precision`` as this process runs it, and a warning when an explicit
    "bfloat16" falls back: ("float32" | "bfloat16", message or None)."""
    if setting == "float32":
        return "float32", None
    if device_has_bf16(device):
        return "bfloat16", None
    if setting == "auto":
        return "float32", None
    return "float32", (f"train.dense_precision = \"bfloat16\": this {device.type.upper()} has "
                       f"no native bfloat16 (AVX512-BF16 or AMX on a CPU); running float32 "
                       f"instead (emulated bfloat16 would be slower)")


@dataclass
class DenseCompute:
    """How training steps run the module: ``precision`` resolved, and ``forward`` the
    compiled module (None: the module itself)."""

    precision: str = "float32"
    forward: Callable | None = None
    device_type: str = "cpu"

    def autocast(self):
        """The context a training forward runs in (bfloat16 autocast, or nothing)."""
        if self.precision != "bfloat16":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=torch.bfloat16)

    def __deepcopy__(self, memo):  # a copy of the module gets the settings, not the compiled
        # forward (it calls the original module)
        return DenseCompute(self.precision, None, self.device_type)

    def __getstate__(self):  # the same for a pickled module (compiled code does not pickle)
        return {**self.__dict__, "forward": None}


def compute_of(model: torch.nn.Module) -> DenseCompute:
    """The module's DenseCompute (a plain float32 one if ``prepare`` never ran)."""
    return getattr(model, COMPUTE_ATTR, None) or DenseCompute()


def prepare(model: torch.nn.Module, precision: str = "float32", compile: bool = False,
            who: str = "the run") -> DenseCompute:
    """Attach how ``model``'s training steps run (``train.dense_precision``, ``train.compile``)
    and return it; logs the precision used and any fallback. The module itself is unchanged
    (its state_dict keys too: torch.compile wraps it, the wrapper is not a submodule)."""
    device = compute_device(model)
    used, warning = resolve_precision(precision, device)
    if warning:
        log.warning("%s: %s", who, warning)
    forward = torch.compile(model) if compile else None
    compute = DenseCompute(used, forward, device.type)
    object.__setattr__(model, COMPUTE_ATTR, compute)  # not a submodule: no state_dict entry
    log.info("%s: dense training steps in %s%s (train.dense_precision = %r)", who, used,
             ", compiled" if compile else "", precision)
    return compute


def warm_up(model: torch.nn.Module, plan, ds, batch_size: int, who: str = "the run") -> float:
    """Compile the module's training forward and backward now, if ``prepare`` asked for it:
    one forward and backward of the first training batch of ``ds`` (its shapes) on zero rows
    from ``plan`` (a LookupPlan), gradients dropped, no optimizer step. Returns the seconds it
    took (0.0 when not compiling). The parameters and the optimizers are untouched; a model
    with dropout draws its masks once more from torch's generator."""
    compute = compute_of(model)
    batch = first_batch(ds, batch_size) if compute.forward is not None else None
    if batch is None:
        return 0.0
    from recsync.model import loss as model_loss  # here: loss.py imports this module
    print(f"{who}: compiling the dense model (train.compile) ...", flush=True)
    start = time.perf_counter()
    tables = plan.dedup(batch)
    rows = [torch.zeros(len(u), dim) for (u, _), dim in zip(tables, plan.dims)]
    pulled = plan.fuse(batch, tables, rows).to(compute_device(model))
    model_loss.loss(model, batch, pulled.embeddings()).backward()
    model.zero_grad(set_to_none=True)
    took = time.perf_counter() - start
    print(f"{who}: compiled in {took:.1f} s (start-up, not training time)", flush=True)
    return took


def compute_device(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def first_batch(ds, batch_size: int):
    """The first training batch of ``ds`` (for ``warm_up``'s shapes), None if it has none."""
    for chunk in ds.chunks("train", batch_size):
        return next(iter(ds.batches(chunk, batch_size)), None)
    return None
