"""A model directory (the layout of docs/serving.md) written with safetensors from a local
model, for the tests of train.init_from."""

import json

import torch
from safetensors.torch import save_file
from torch.nn.utils import parameters_to_vector

from recsync.modes.handover import to_flat


def write_model_dir(path, cfg, model, *, optimizer_state: bool = True) -> dict:
    """``model``: a local_run.LocalModel (trained a little). Returns what was written: per
    table (ids, rows, state), the dense state_dict and the flat dense optimizer state."""
    path.mkdir(parents=True)
    store = model.lookup.store
    snap = store.snapshot()
    tables, entries = [], []
    for t, spec in enumerate(store.tables):
        ids = torch.from_numpy(snap[f"t{t}.local"]).long()
        rows = torch.from_numpy(snap[f"t{t}.weights"])
        state = torch.from_numpy(snap[f"t{t}.state"])
        arrays = {"ids": ids, "rows": rows, **({"state": state} if optimizer_state else {})}
        save_file(arrays, str(path / f"table-{t:03d}.safetensors"))
        tables.append((ids, rows, state if optimizer_state else None))
        entries.append({"name": spec.name, "rows": spec.rows, "dim": spec.dim,
                        "file": f"table-{t:03d}.safetensors", "trained_rows": len(ids),
                        "state_dim": store.optimizer.state_dim})
    dense = {k: v.detach().clone().contiguous() for k, v in model.dense.state_dict().items()}
    save_file(dense, str(path / "dense.safetensors"))
    params = list(model.dense.parameters())
    flat = to_flat(model.dense_optimizer.state_dict(), [p.shape for p in params])
    if optimizer_state:
        save_file({k: v.contiguous() for k, v in flat["state"][0].items()},
                  str(path / "dense_optimizer.safetensors"))
    t = cfg.train
    meta = {"format": "recsync-model", "format_version": 1, "recsync_version": "test",
            "model": cfg.model.model_dump(mode="json"),
            "train": {"seed": t.seed, "embedding_init_scale": cfg.model.embedding_init_scale,
                      "embedding_optimizer": t.embedding_optimizer,
                      "embedding_lr": t.embedding_lr, "dense_optimizer": t.dense_optimizer,
                      "dense_lr": t.dense_lr},
            "data": {}, "tables": entries,
            "dense": {"file": "dense.safetensors",
                      "parameters": int(parameters_to_vector(params).numel())},
            "optimizer_state": optimizer_state, "run": {"mode": "local"}}
    (path / "model.json").write_text(json.dumps(meta))
    return {"tables": tables, "dense": dense, "optimizer": flat["state"][0]}
