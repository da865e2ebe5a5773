"""Where a worker computes: its GPU with ``cluster.worker_gpus > 0``, else the CPU.

On a GPU worker the dense model, the rows a step pulled and the batch's features live on the
GPU for the forward and backward pass; what crosses processes (row and dense gradients to the
PS shards, dense states for checkpoints and switching) is copied back to host memory, and the
shards stay on CPU. Sync's and hybrid's all-reduce runs on NCCL there.
"""

from __future__ import annotations

import os

import numpy as np
import torch


def worker_device(cfg) -> torch.device:
    """This worker's device; RuntimeError where the config asks for a GPU it cannot see."""
    if cfg.cluster.worker_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"cluster.worker_gpus = {cfg.cluster.worker_gpus:g}, but this worker "
                           f"sees no CUDA device (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}; is torch a "
                           f"CUDA build? torch {torch.__version__})")
    device = torch.device("cuda", 0)  # Ray's CUDA_VISIBLE_DEVICES: the worker's own GPU first
    torch.cuda.set_device(device)
    return device


def host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in host memory, as numpy (a view where it is on the CPU already)."""
    return t.detach().cpu().numpy()


def group_backend(device: torch.device) -> str:
    """The collective backend of a group of workers on ``device``."""
    return "nccl" if device.type == "cuda" else "gloo"


def on_host(state):
    """An optimizer's ``state_dict()`` (any nesting of dicts and lists) with every tensor in
    host memory: what crosses processes."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: on_host(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_host(v) for v in state)
    return state
