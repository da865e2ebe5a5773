"""ShardCores with a mode's rule, and push helpers shaped like the calls the worker halves make,
for the unit tests of the PS without Ray.

``test_core`` builds a core whose rules are built by name ("async", "sync", "gba", "easgd"), so
one core can take, for example, a GBA push and then sync pushes after ``advance_to`` (switching).
"""

from __future__ import annotations

from recsync.modes.async_ps import ApplyNow
from recsync.modes.gba import GlobalBatch
from recsync.modes.shadow.synchronizers import CenterCopy
from recsync.modes.sync import StepBarrier
from recsync.ps.aggregation import StalenessDecay
from recsync.ps.core import ShardCore


def test_core(tables, row_optimizer, *, num_workers: int = 1, gba_gradients: int = 0,
              decay: StalenessDecay = StalenessDecay(0, "none"), center=None,
              mode: str | None = None, **kw) -> ShardCore:
    def rule(name: str):
        return {"async": ApplyNow, "sync": lambda: StepBarrier(num_workers),
                "gba": lambda: GlobalBatch(gba_gradients or num_workers, decay),
                "easgd": lambda: CenterCopy(center)}[name]()

    mode = mode or ("easgd" if center is not None else "async")
    return ShardCore(tables, row_optimizer, rule=rule(mode), mode=mode, make_rule=rule, **kw)


test_core.__test__ = False  # a helper, not a test


def push(core, ids, grads, dense_grad, version_read: int = 0, lr_scale: float = 1.0,
         sampled=None):
    """Async's push (ApplyNow; EASGD's center shard trains rows the same way)."""
    return core.push(ids, grads, dense_grad, {"version_read": version_read,
                                              "lr_scale": lr_scale, "sampled": sampled})


def push_sync(core, step: int, ids, grads, dense_grad, samples: int, sampled=None):
    core.use_mode("sync")
    return core.push(ids, grads, dense_grad, {"step": step, "samples": samples,
                                              "sampled": sampled})


def push_gba(core, ids, grads, dense_grad, token: int, samples: int, sampled=None):
    core.use_mode("gba")
    return core.push(ids, grads, dense_grad, {"version_read": token, "samples": samples,
                                              "sampled": sampled})


def worker_half(worker_cls, model, client, **cfg_sections):
    """A mode's worker half on ``model`` and ``client``, as a worker would build it;
    ``cfg_sections`` (e.g. ``eager=EagerConfig(...)``) go into the run's config."""
    from recsync.config import RunConfig
    from recsync.modes.base import WorkerContext
    cfg = RunConfig(**cfg_sections)
    return worker_cls(WorkerContext(rank=0, cfg=cfg, model=model, client=client,
                                    new_client=lambda: client, shards=client.shards))
