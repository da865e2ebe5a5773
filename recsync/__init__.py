"""recsync: train CTR models with a choice of worker synchronization (see recsync/api.py).

Attributes load on first use, so that `import recsync` (and the `recsync` command) stays fast.
"""

from __future__ import annotations

import importlib

__all__ = ["ConfigError", "RunConfig", "RunResult", "convert", "load_config", "load_model",
           "override", "save_config", "scale", "simulate", "train", "tune"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("recsync.api"), name)
    raise AttributeError(f"module 'recsync' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
