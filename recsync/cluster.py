"""Start or join Ray, and always leave nothing behind."""

from __future__ import annotations

import contextlib
import logging
import os

from recsync.config import ClusterConfig


@contextlib.contextmanager
def ray_session(cfg: ClusterConfig):
    """Embedded default: a local Ray instance with the dashboard off and a bounded object
    store, shut down on exit (also on error and Ctrl-C). With ``cfg.address``: join that
    cluster, and only disconnect from it on exit."""
    import ray
    if ray.is_initialized():  # e.g. a test's session-scoped cluster
        yield
        return
    if cfg.address:
        ray.init(address=cfg.address, logging_level=logging.WARNING)
    else:
        ray.init(include_dashboard=False, object_store_memory=cfg.object_store_mb * 2**20,
                 num_cpus=os.cpu_count(), logging_level=logging.WARNING,
                 configure_logging=True, log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()
