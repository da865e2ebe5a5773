"""Job checkpoints: what a whole run needs to go on from a checkpoint round, besides the shards'
own checkpoints (which it names by sequence number).

A job checkpoint is a checkpoint file (files.py) in ``<checkpoints>/job`` holding:

- arrays: the dense parameters where the workers hold them (sync: with the optimizer state in
  the PS's flat layout; shadow and foreground: worker 0's replica), else none (the dense
  parameters live on PS shard 0 and are in its checkpoint);
- meta: each shard's checkpoint sequence number of this round, the data position (the work
  queue's state), the samples and steps done per worker rank, training time so far, the global
  step (sync), and ``final`` for the checkpoint written when the run completed.

Full recovery and ``recsync train --resume`` go back to the newest job checkpoint whose shard
checkpoints all load (``restorable``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from recsync.checkpoint import files

JOB_DIR = "job"


def dense_arrays(state: dict | None) -> dict[str, np.ndarray]:
    """{"params": flat vector, "optimizer": flat state_dict or None} -> arrays."""
    if state is None:
        return {}
    arrays = {"dense.params": np.asarray(state["params"], dtype=np.float32).copy()}
    opt = state.get("optimizer")
    if opt is not None:
        for key, value in opt["state"].get(0, {}).items():
            arrays[f"dense.opt.{key}"] = torch.as_tensor(value).detach().numpy().copy()
    return arrays


def dense_meta(state: dict | None) -> list | None:
    """The optimizer's param_groups (plain JSON), to rebuild its state_dict."""
    if state is None or state.get("optimizer") is None:
        return None
    return state["optimizer"]["param_groups"]


def dense_state(ckpt: files.Checkpoint) -> dict | None:
    """The inverse of ``dense_arrays`` + ``dense_meta``: {"params", "optimizer"} or None."""
    if "dense.params" not in ckpt.arrays:
        return None
    groups = ckpt.meta.get("dense_param_groups")
    optimizer = None
    if groups is not None:
        state = {k.removeprefix("dense.opt."): torch.from_numpy(np.array(v))
                 for k, v in ckpt.arrays.items() if k.startswith("dense.opt.")}
        optimizer = {"state": {0: state} if state else {}, "param_groups": groups}
    return {"params": np.array(ckpt.arrays["dense.params"]), "optimizer": optimizer}


def job_dir(checkpoint_dir: str | Path) -> Path:
    return Path(checkpoint_dir) / JOB_DIR


def restorable(checkpoint_dir: str | Path) -> tuple[files.Checkpoint | None, list[str]]:
    """The newest job checkpoint whose own file and every shard checkpoint it names load, and
    why newer ones were passed over. (None, reasons) if there is none."""
    skipped: list[str] = []
    for path in files.manifests(job_dir(checkpoint_dir)):
        try:
            ckpt = files.load(path)
            for shard, sequence in enumerate(ckpt.meta["shard_sequences"]):
                files.chain(shard_dir(checkpoint_dir, shard), sequence)
        except files.CheckpointError as e:
            skipped.append(str(e))
            continue
        return ckpt, skipped
    return None, skipped


def shard_dir(checkpoint_dir: str | Path, shard: int) -> Path:
    return Path(checkpoint_dir) / f"shard-{shard}"
