"""ShardCores behind objects shaped like Ray actor handles, for PSClient tests without Ray.

Each ``handle.method.remote(*args)`` runs the core's method at once and returns its result with
arrays made read-only, as Ray hands them over; patch ``recsync.ps.client.ray.get`` to the
identity (``patch_ray_get``) so that the client's waits return those results.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import recsync.ps.client as client_mod


def readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.flags.writeable = False
    return a


def _ro(x):
    if isinstance(x, np.ndarray):
        return readonly(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_ro(v) for v in x)
    return x


def fake_shards(cores) -> list[SimpleNamespace]:
    return [SimpleNamespace(
        pull=SimpleNamespace(remote=lambda ids, min_version=0, read_only=False, dense=True, c=c:
                             _ro(c.pull(ids, read_only, dense))),
        push=SimpleNamespace(remote=lambda *a, c=c: _ro(c.push(*_ro(a)))),
    ) for c in cores]


def patch_ray_get(monkeypatch) -> None:
    monkeypatch.setattr(client_mod.ray, "get", lambda refs: refs)
