"""Which config keys a resumed run may change: where and on how many processes it runs, what
it writes, not what it trains. A job checkpoint keeps the config of the run that wrote it
(``meta["config"]``); ``recsync train --resume DIR`` compares DIR's config.toml (with any
``--set``) against it and refuses any other change in one line naming the key."""

from __future__ import annotations

import json

# keys (or sections, ending in ".") a resumed run may change
MAY_CHANGE = ("cluster.workers", "cluster.ps_shards", "cluster.address",
              "cluster.object_store_mb", "cluster.keep_ray_logs", "output.", "train.threads",
              "train.eval_batch_size", "recovery.keep")


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and the values of ``model.params`` stay whole."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name != "model.params":
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def may_change(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in MAY_CHANGE)


def check_resume_config(saved: dict, now: dict, where: str) -> list[str]:
    """``saved``: the checkpointed run's config (model_dump), ``now``: the resumed run's;
    ``where``: the config file, for messages. Returns the changes made ("key: old -> new");
    ValueError names the first key that may not change. Keys only one side has (another
    recsync version's) are not compared."""
    if not isinstance(saved, dict):
        raise ValueError(f"{where}: the checkpointed run's config is not a table (the job "
                         f"checkpoint's meta is corrupt)")
    old, new = flatten(saved), flatten(now)
    changes = []
    for key in sorted(old.keys() & new.keys()):
        if old[key] == new[key]:
            continue
        a, b = json.dumps(old[key]), json.dumps(new[key])
        if not may_change(key):
            allowed = ", ".join(k + ("*" if k.endswith(".") else "") for k in MAY_CHANGE)
            raise ValueError(f"{where}: {key} = {b} but the checkpointed run had {a}; a "
                             f"resumed run may change only {allowed} (start a new run to "
                             f"change the rest)")
        changes.append(f"{key}: {a} -> {b}")
    return changes
