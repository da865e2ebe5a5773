"""A fake actor (fake_ray.py says what is faked): its incarnations (processes), each with a
thread of its own (an asyncio loop for an async actor) that runs its calls in order; its death,
and its restart from its constructor's arguments."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import pickle
import queue
import threading
import time
from typing import TYPE_CHECKING

import ray

from fake_transport import Dead, Group, Handle, Ref, check_alive, copy, register, settle

if TYPE_CHECKING:
    from fake_ray import Runtime

_pids = itertools.count(900_001)  # fake pids: one per incarnation
# Constructors run one at a time: each seeds torch's generator and builds its model from it,
# which in one process (one generator) must not interleave, as it cannot across processes.
_CONSTRUCTING = threading.Lock()


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
        self.id = register(self)
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
        check_alive()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        ref = Ref(fut)
        with self.lock:
            inc = self.inc
            if inc is None:
                settle(fut, error=self.gone)
                return ref
            if name != "die":
                inc.pending.add(fut)
                fut.add_done_callback(inc.pending.discard)
        if name == "die":  # the process exits now
            self.crash(inc)
            settle(fut, error=ray.exceptions.ActorDiedError())
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
        if name == "join_group":  # (host, port, world[, group rank, batch size])
            _, port, world, *more = args
            if len(more) > 1 and more[1] is not None:
                inc.instance.batch_size = more[1]
            inc.group = self.runtime.group(("group", port), world)
            inc.subgroups = 0  # as torch's group count, reset by destroy_process_group
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

    def _invoke(self, inc: Incarnation, name: str, payload) -> tuple[bool, object]:
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
            _, out = self._invoke(inc, name, payload)
            settle(fut, copy(out))
        except Dead:
            pass
        except BaseException as e:  # noqa: BLE001 - the caller's ray.get raises it
            settle(fut, error=e)

    def _run_async(self, inc, name, payload, fut) -> None:
        if inc.dead:
            return
        try:
            plain, out = self._invoke(inc, name, payload)
        except BaseException as e:  # noqa: BLE001
            settle(fut, error=e)
            return
        if plain:
            settle(fut, copy(out))
            return

        async def wrapped():
            try:
                settle(fut, copy(await out))
            except (Dead, asyncio.CancelledError):
                pass
            except BaseException as e:  # noqa: BLE001
                settle(fut, error=e)
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
            settle(fut, error=error)
        for g in inc.groups:
            g.broken()
        _end_writes(getattr(inc.instance, "writer", None))
        if inc.loop is not None:
            inc.loop.call_soon_threadsafe(inc.loop.stop)
        elif inc.tasks is not None:
            inc.tasks.put(None)


def _end_writes(writer) -> None:
    """A dead shard's checkpoint writer (checkpoint/writer.py) completes nothing more: the
    writes it had not begun are dropped, and the one under way stops before its manifest
    (fake_ray.install's ``files.write``), where a process's death leaves a write: its data
    file without a manifest."""
    if writer is None or not hasattr(writer, "_queue"):
        return
    q = writer._queue
    with q.mutex:
        dropped = len(q.queue)
        q.queue.clear()
        q.unfinished_tasks -= dropped
        q.all_tasks_done.notify_all()
