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

import asyncio
import concurrent.futures
import itertools
import os
import pickle
import queue
import threading
import time

import ray
import ray.actor
import ray.util
import torch.distributed as dist

NODE_ID = "fa4e" * 14  # one node, named as Ray names them (56 hex digits)
GROUP_TIMEOUT_S = 60  # an all-reduce no peer joins: as gloo's timeout, an error
_pids = itertools.count(900_001)  # fake pids: one per incarnation
# Constructors run one at a time: each seeds torch's generator and builds its model from it,
# which in one process (one generator) must not interleave, as it cannot across processes.
_CONSTRUCTING = threading.Lock()


class Dead(BaseException):
    """Raised in a thread of an actor whose process died, at its next call: it stops there."""


def _actor_of_thread():
    return getattr(threading.current_thread(), "_fake_incarnation", None)


def _check_alive() -> None:
    inc = _actor_of_thread()
    if inc is not None and inc.dead:
        raise Dead()


def _settle(fut: concurrent.futures.Future, result=None, error: BaseException | None = None):
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:  # already failed: its actor died
        pass


def _copy(x):
    return pickle.loads(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


class Ref:
    """An ObjectRef: a future, awaitable in an async actor."""

    def __init__(self, runtime: "Runtime", fut: concurrent.futures.Future):
        self.runtime, self.fut = runtime, fut
        self.id = runtime.register(self)

    def __await__(self):
        return asyncio.wrap_future(self.fut).__await__()

    def __reduce__(self):
        return (_ref, (self.id,))


class Handle:
    """An actor handle: ``handle.verb.remote(*args)``."""

    def __init__(self, actor: "Actor"):
        self._actor = actor

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Method(self._actor, name)

    def __reduce__(self):
        return (_handle, (self._actor.id,))


class _Method:
    def __init__(self, actor: "Actor", name: str):
        self.actor, self.name = actor, name

    def remote(self, *args, **kwargs) -> Ref:
        return self.actor.call(self.name, args, kwargs)

    def options(self, **_):
        return self


_RUNTIME: "Runtime | None" = None


def _ref(i: int) -> Ref:
    return _RUNTIME.objects[i]


def _handle(i: int) -> Handle:
    return _RUNTIME.objects[i].handle


class Group:
    """A gloo group among worker threads: all-reduce (sum, in rank order), broken for good
    when a member dies."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=GROUP_TIMEOUT_S)
        self.bufs: dict[int, object] = {}
        self.lock = threading.Lock()

    def all_reduce(self, rank: int, buf) -> None:
        with self.lock:
            self.bufs[rank] = buf.detach().clone()
        self._wait()
        total = sum(self.bufs[r] for r in sorted(self.bufs))
        self._wait()  # every member has summed before any writes its next round's buffer
        with self.lock:
            del self.bufs[rank]
        buf.copy_(total)

    def _wait(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            _check_alive()
            raise RuntimeError("[fake gloo] Connection closed by peer: a member of the group "
                               "died") from None

    def broken(self) -> None:
        self.barrier.abort()


class Incarnation:
    """One process of an actor: its instance, its thread(s), its calls in flight."""

    def __init__(self, actor: "Actor", reconstructed: bool):
        self.actor, self.reconstructed = actor, reconstructed
        self.pid = next(_pids)
        self.dead = False
        self.instance = None
        self.pending: set[concurrent.futures.Future] = set()
        self.groups: list[Group] = []
        self.group: Group | None = None
        self.world = 0
        self.subgroups = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: queue.SimpleQueue | None = None


class Actor:
    """An actor across its incarnations (Ray's restarts)."""

    def __init__(self, runtime: "Runtime", cls, args, kwargs, max_restarts: int):
        self.runtime, self.cls = runtime, cls
        self.name = cls.__mro__[1].__name__ if len(cls.__mro__) > 1 else cls.__name__
        self.payload = pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        self.is_async = any(asyncio.iscoroutinefunction(getattr(cls, n, None))
                            for n in dir(cls) if not n.startswith("__"))
        self.restarts_left = max(0, max_restarts)
        self.lock = threading.Lock()
        self.gone: BaseException | None = None  # why calls fail for good
        self.id = runtime.register(self)
        self.handle = Handle(self)
        self.inc = self._start(reconstructed=False)

    # -- incarnations -------------------------------------------------------------------------
    def _start(self, reconstructed: bool) -> Incarnation:
        inc = Incarnation(self, reconstructed)
        delay = self.runtime.restart_delay_s if reconstructed else 0.0
        if self.is_async:
            inc.loop = asyncio.new_event_loop()
            target = self._serve_async
        else:
            inc.tasks = queue.SimpleQueue()
            target = self._serve
        t = threading.Thread(target=target, args=(inc, delay), daemon=True,
                             name=f"fake-{self.name}-{inc.pid}")
        t._fake_incarnation = inc
        t.start()
        return inc

    def _construct(self, inc: Incarnation, delay: float) -> bool:
        if delay:
            time.sleep(delay)
        try:
            args, kwargs = self._resolved(pickle.loads(self.payload))
            with _CONSTRUCTING:
                inc.instance = self.cls(*args, **kwargs)
            return True
        except Dead:
            return False
        except Exception as e:  # Ray: the actor died in its creation task
            err = ray.exceptions.RayActorError(
                error_msg=f"The actor died because of an error raised in its creation task, "
                          f"{self.name}.__init__():\n{type(e).__name__}: {e}",
                actor_init_failed=True)
            self._end(inc, restart=False, error=err)
            return False

    def _serve(self, inc: Incarnation, delay: float) -> None:
        if not self._construct(inc, delay):
            return
        while True:
            task = inc.tasks.get()
            if task is None or inc.dead:
                return
            task()

    def _serve_async(self, inc: Incarnation, delay: float) -> None:
        asyncio.set_event_loop(inc.loop)
        if not self._construct(inc, delay):
            return
        try:
            inc.loop.run_forever()
        finally:
            for task in asyncio.all_tasks(inc.loop):
                task.cancel()

    # -- calls --------------------------------------------------------------------------------
    def call(self, name: str, args, kwargs) -> Ref:
        _check_alive()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        ref = Ref(self.runtime, fut)
        with self.lock:
            inc = self.inc
            if inc is None:
                _settle(fut, error=self.gone)
                return ref
            if name == "die":  # the process exits now
                pass
            else:
                inc.pending.add(fut)
                fut.add_done_callback(inc.pending.discard)
        if name == "die":
            self.crash(inc)
            _settle(fut, error=ray.exceptions.ActorDiedError())
            return ref
        payload = pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        if inc.loop is not None:
            inc.loop.call_soon_threadsafe(self._run_async, inc, name, payload, fut)
        else:
            inc.tasks.put(lambda: self._run(inc, name, payload, fut))
        return ref

    def _resolved(self, call):
        args, kwargs = call
        args = [self.runtime.get(a) if isinstance(a, Ref) else a for a in args]
        kwargs = {k: self.runtime.get(v) if isinstance(v, Ref) else v for k, v in kwargs.items()}
        return args, kwargs

    def _intercepted(self, inc: Incarnation, name: str, args):
        """The verbs that touch the process or the network, done here; None: not one."""
        if name == "address":  # gloo's store: the group is found by its port
            return ("127.0.0.1", self.runtime.new_port())
        if name == "join_group":
            _, port, world = args
            inc.group = self.runtime.group(("group", port), world)
            inc.groups.append(inc.group)
            inc.world = world
            return None
        if name == "die_in_next_write":
            if inc.instance.writer is None:
                raise ValueError("this shard writes no checkpoints (recovery is off)")

            def die_now():
                self.crash(inc)
                raise Dead()
            inc.instance.writer.before_manifest = die_now
            return None
        raise KeyError(name)

    def _invoke(self, inc: Incarnation, name: str, payload, fut) -> tuple[bool, object]:
        """(True, result) of a plain call made here, or (False, coroutine) of an async one."""
        args, kwargs = self._resolved(pickle.loads(payload))
        if name in ("address", "join_group", "die_in_next_write"):
            return True, self._intercepted(inc, name, args)
        out = getattr(inc.instance, name)(*args, **kwargs)
        if asyncio.iscoroutine(out):
            return False, out
        return True, out

    def _run(self, inc, name, payload, fut) -> None:
        if inc.dead:
            return
        try:
            _, out = self._invoke(inc, name, payload, fut)
            _settle(fut, _copy(out))
        except Dead:
            pass
        except BaseException as e:  # noqa: BLE001 - the caller's ray.get raises it
            _settle(fut, error=e)

    def _run_async(self, inc, name, payload, fut) -> None:
        if inc.dead:
            return
        try:
            plain, out = self._invoke(inc, name, payload, fut)
        except BaseException as e:  # noqa: BLE001
            _settle(fut, error=e)
            return
        if plain:
            _settle(fut, _copy(out))
            return

        async def wrapped():
            try:
                _settle(fut, _copy(await out))
            except (Dead, asyncio.CancelledError):
                pass
            except BaseException as e:  # noqa: BLE001
                _settle(fut, error=e)
        inc.loop.create_task(wrapped())

    # -- deaths -------------------------------------------------------------------------------
    def crash(self, inc: Incarnation, restart: bool = True) -> None:
        """Incarnation ``inc`` dies (its process exits); Ray restarts the actor if it may."""
        self._end(inc, restart, ray.exceptions.ActorDiedError())

    def _end(self, inc: Incarnation, restart: bool, error: BaseException) -> None:
        with self.lock:
            if inc.dead:
                return
            inc.dead = True
            if self.inc is inc:
                if restart and self.restarts_left > 0 and self.gone is None:
                    self.restarts_left -= 1
                    self.inc = self._start(reconstructed=True)
                else:
                    self.inc, self.gone = None, error
            pending = list(inc.pending)
        for fut in pending:
            _settle(fut, error=error)
        for g in inc.groups:
            g.broken()
        writer = getattr(inc.instance, "writer", None)
        if writer is not None and hasattr(writer, "_queue"):  # the writes it had not begun
            with writer._queue.mutex:
                writer._queue.queue.clear()
        if inc.loop is not None:
            inc.loop.call_soon_threadsafe(inc.loop.stop)
        elif inc.tasks is not None:
            inc.tasks.put(None)


class Runtime:
    """The fake Ray of one test: its actors and objects, groups, and the patches."""

    def __init__(self, restart_delay_s: float = 0.05):
        self.restart_delay_s = restart_delay_s
        self.objects: dict[int, object] = {}
        self._ids = itertools.count(1)
        self._ports = itertools.count(40_001)
        self.groups: dict[tuple, Group] = {}
        self.lock = threading.Lock()

    def register(self, obj) -> int:
        i = next(self._ids)
        self.objects[i] = obj
        return i

    def new_port(self) -> int:
        return next(self._ports)

    def group(self, key: tuple, size: int) -> Group:
        with self.lock:
            if key not in self.groups:
                self.groups[key] = Group(size)
            return self.groups[key]

    def actors(self) -> list[Actor]:
        return [o for o in self.objects.values() if isinstance(o, Actor)]

    # -- ray's functions ------------------------------------------------------------------------
    def get(self, refs, timeout: float | None = None):
        _check_alive()
        one = isinstance(refs, Ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for r in [refs] if one else list(refs):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(r.fut.result(timeout=left))
            except concurrent.futures.TimeoutError:
                _check_alive()
                raise ray.exceptions.GetTimeoutError(
                    f"Get timed out: some object(s) not ready after {timeout} s") from None
        _check_alive()
        return out[0] if one else out

    def wait(self, refs, num_returns: int = 1, timeout: float | None = None, **_):
        _check_alive()
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
        fut.set_result(_copy(value))
        return Ref(self, fut)

    def kill(self, handle: Handle, no_restart: bool = True) -> None:
        actor = handle._actor
        inc = actor.inc
        if inc is not None:
            actor._end(inc, restart=not no_restart, error=ray.exceptions.ActorDiedError())

    def new_actor(self, actor_class, options: dict, args, kwargs) -> Handle:
        meta = actor_class.__ray_metadata__
        restarts = options.get("max_restarts", meta.max_restarts) or 0
        return Actor(self, meta.modified_class, args, kwargs, restarts).handle

    # -- torch.distributed within an actor --------------------------------------------------
    def all_reduce(self, buf, group=None, **_):
        _check_alive()
        inc = _actor_of_thread()
        g = group or (inc and inc.group)
        if g is None:
            raise RuntimeError("[fake gloo] all_reduce outside a worker's group")
        g.all_reduce(inc.instance.rank, buf)

    def new_group(self, **_):
        inc = _actor_of_thread()
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
        inc = _actor_of_thread()
        return bool(inc is not None and inc.reconstructed)


_getpid = os.getpid


def _actor_pid() -> int:
    """An actor's thread: its incarnation's pid (one process each, as on Ray)."""
    inc = _actor_of_thread()
    return inc.pid if inc is not None else _getpid()


def install(monkeypatch, restart_delay_s: float = 0.05) -> Runtime:
    """Patch Ray (and gloo's verbs) for one test; returns the runtime (``shutdown`` at the end)."""
    global _RUNTIME
    rt = _RUNTIME = Runtime(restart_delay_s)

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
    start = threading.Thread.start

    def start_in_actor(self):  # a thread an actor starts is that actor's (it dies with it)
        if not hasattr(self, "_fake_incarnation"):
            self._fake_incarnation = _actor_of_thread()
        start(self)
    monkeypatch.setattr(threading.Thread, "start", start_in_actor)
    hook = threading.excepthook
    monkeypatch.setattr(threading, "excepthook",
                        lambda a: None if issubclass(a.exc_type, Dead) else hook(a))
    return rt
