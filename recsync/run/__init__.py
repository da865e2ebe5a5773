"""One run's life: run() (driver.py), the local run, the checks before it, how it ends, what
it records and what it writes.

``from recsync.run import run`` and the other names driver.py defines (``__all__``) work as
they did when this package was one module, run.py. They load on first use, so that importing
one part of the package (run/signals.py: the command at start, data/ and the workers) imports
neither torch nor the rest of the run.
"""

from __future__ import annotations

import importlib

__all__ = ["RUN_FILES", "check_remote_out", "checkpoint_root", "prepare_run_dir",
           "resolved_for_data", "resume_point", "run", "upload_outputs", "write_outputs"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("recsync.run.driver"), name)
    raise AttributeError(f"module 'recsync.run' has no attribute {name!r}")
