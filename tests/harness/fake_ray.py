"""Ray's transport faked in one process, for the runtime harness (tests/harness).

The real actors run here: PSShard (ShardCore with every mode's rule, its checkpoint writer),
WorkQueue, Worker (its training loop, its mode, its PS client), ShardDirectory. Each actor has
a thread of its own (an asyncio loop for an async actor); calls to it are queued in order, as
Ray queues them, and their arguments and answers are copied (pickled), as Ray serializes them.
Only the transport is faked:

- ``Cls.remote(...)`` / ``Cls.options(...).remote(...)``, ``handle.verb.remote(...)``,
  ``ray.get`` / ``wait`` / ``put`` / ``kill``, ``await ref`` inside an async actor;
- a process's death: ``die`` (and a checkpoint write that ``die_in_next_write`` armed) ends
  the actor's incarnation; its calls in flight fail with ActorDiedError, and its threads stop
  at their next call (``Dead``); an actor with ``max_restarts`` left is built again from its
  constructor's arguments (``was_current_actor_reconstructed`` then says so) with a pid of its
  own, as Ray restarts a process;
- the workers' gloo group: an all-reduce among their threads (summed in rank order); a
  member's death breaks the group, as a closed connection breaks gloo's.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
import time

import ray
import ray.actor
import ray.util
import torch.distributed as dist

from recsync.checkpoint import files

from fake_actor import Actor
from fake_transport import OBJECTS, Dead, Group, Handle, Ref, actor_of_thread, check_alive, copy

NODE_ID = "fa4e" * 14  # one node, named as Ray names them (56 hex digits)


class Runtime:
    """The fake Ray of one test: its actors and objects, groups, and the patches."""

    def __init__(self, restart_delay_s: float = 0.05):
        self.restart_delay_s = restart_delay_s
        self.created: list[Actor] = []
        self._ports = itertools.count(40_001)
        self.groups: dict[tuple, Group] = {}
        self.lock = threading.Lock()

    def new_port(self) -> int:
        return next(self._ports)

    def group(self, key: tuple, size: int) -> Group:
        with self.lock:
            if key not in self.groups:
                self.groups[key] = Group(size)
            return self.groups[key]

    def actors(self) -> list[Actor]:
        return list(self.created)

    # -- ray's functions ------------------------------------------------------------------------
    def get(self, refs, timeout: float | None = None):
        check_alive()
        one = isinstance(refs, Ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for r in [refs] if one else list(refs):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(r.fut.result(timeout=left))
            except concurrent.futures.TimeoutError:
                check_alive()
                raise ray.exceptions.GetTimeoutError(
                    f"Get timed out: some object(s) not ready after {timeout} s") from None
        check_alive()
        return out[0] if one else out

    def wait(self, refs, num_returns: int = 1, timeout: float | None = None, **_):
        check_alive()
        refs = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = [r for r in refs if r.fut.done()]
            if len(ready) >= num_returns or (deadline is not None
                                             and time.monotonic() >= deadline):
                ready = ready[:num_returns]
                return ready, [r for r in refs if r not in ready]
            time.sleep(0.002)

    def put(self, value) -> Ref:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(copy(value))
        return Ref(fut)

    def kill(self, handle: Handle, no_restart: bool = True) -> None:
        actor = handle._actor
        inc = actor.inc
        if inc is not None:
            actor._end(inc, restart=not no_restart, error=ray.exceptions.ActorDiedError())

    def new_actor(self, actor_class, options: dict, args, kwargs) -> Handle:
        meta = actor_class.__ray_metadata__
        restarts = options.get("max_restarts", meta.max_restarts) or 0
        actor = Actor(self, meta.modified_class, args, kwargs, restarts)
        self.created.append(actor)
        return actor.handle

    # -- torch.distributed within an actor --------------------------------------------------
    def all_reduce(self, buf, group=None, **_):
        check_alive()
        inc = actor_of_thread()
        g = group or (inc and inc.group)
        if g is None:
            raise RuntimeError("[fake gloo] all_reduce outside a worker's group")
        g.all_reduce(inc.instance.rank, buf)

    def new_group(self, **_):
        inc = actor_of_thread()
        inc.subgroups += 1
        g = self.group(("sub", id(inc.group), inc.subgroups), inc.world)
        inc.groups.append(g)
        return g

    def shutdown(self) -> None:
        """Every actor dies, none restarts; their threads stop at their next call."""
        for actor in self.actors():
            inc = actor.inc
            if inc is not None:
                actor.restarts_left = 0
                actor._end(inc, restart=False, error=ray.exceptions.ActorDiedError())


class _Context:
    def get_node_id(self) -> str:
        return NODE_ID

    @property
    def was_current_actor_reconstructed(self) -> bool:
        inc = actor_of_thread()
        return bool(inc is not None and inc.reconstructed)


_getpid = os.getpid


def _actor_pid() -> int:
    """An actor's thread: its incarnation's pid (one process each, as on Ray)."""
    inc = actor_of_thread()
    return inc.pid if inc is not None else _getpid()


def install(monkeypatch, restart_delay_s: float = 0.05) -> Runtime:
    """Patch Ray (and gloo's verbs) for one test; returns the runtime (``shutdown`` at the end)."""
    OBJECTS.clear()  # an earlier test's refs and handles
    rt = Runtime(restart_delay_s)

    class _Options:
        def __init__(self, cls, opts):
            self.cls, self.opts = cls, opts

        def remote(self, *args, **kwargs):
            return rt.new_actor(self.cls, self.opts, args, kwargs)

    monkeypatch.setattr(ray.actor.ActorClass, "options",
                        lambda self, **opts: _Options(self, opts))
    monkeypatch.setattr(ray.actor.ActorClass, "remote",
                        lambda self, *a, **kw: rt.new_actor(self, {}, a, kw))
    for name, fn in {"get": rt.get, "wait": rt.wait, "put": rt.put, "kill": rt.kill,
                     "is_initialized": lambda: True,
                     "get_runtime_context": _Context,
                     "available_resources": lambda: {"CPU": 2.0},
                     "nodes": lambda: [{"NodeID": NODE_ID, "Alive": True,
                                        "NodeManagerAddress": "127.0.0.1",
                                        "Resources": {"CPU": 2.0}}]}.items():
        monkeypatch.setattr(ray, name, fn)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    monkeypatch.setattr(os, "getpid", _actor_pid)
    monkeypatch.setattr(dist, "all_reduce", rt.all_reduce)
    monkeypatch.setattr(dist, "new_group", rt.new_group)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: actor_of_thread().world)
    write = files.write

    def write_until_dead(directory, sequence, arrays, meta, before_manifest=None):
        """A checkpoint write of a shard that died meanwhile ends before its manifest."""
        def last_moment():
            check_alive()
            if before_manifest is not None:
                before_manifest()
        return write(directory, sequence, arrays, meta, last_moment)
    monkeypatch.setattr(files, "write", write_until_dead)
    start = threading.Thread.start

    def start_in_actor(self):  # a thread an actor starts is that actor's: it dies with it
        if not hasattr(self, "_fake_incarnation"):
            self._fake_incarnation = actor_of_thread()
        if self._fake_incarnation is not None:
            run = self.run

            def run_until_dead():
                try:
                    run()
                except Dead:  # its process died: the thread ends here, as it would with it
                    pass
            self.run = run_until_dead
        start(self)
    monkeypatch.setattr(threading.Thread, "start", start_in_actor)
    return rt
