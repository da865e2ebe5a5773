"""The fake transport's pieces (fake_ray.py says what it is): object refs, actor handles and
their calls (copied by pickling, found again by id), a dead actor's threads stopped (``Dead``),
and the workers' group (an all-reduce among threads)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import pickle
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fake_actor import Actor

GROUP_TIMEOUT_S = 60  # an all-reduce no peer joins: as gloo's timeout, an error
OBJECTS: dict[int, object] = {}  # id -> Ref or Actor: what a pickled ref or handle names
_ids = itertools.count(1)


def register(obj) -> int:
    i = next(_ids)
    OBJECTS[i] = obj
    return i


class Dead(BaseException):
    """Raised in a thread of an actor whose process died, at its next call: it stops there."""


def actor_of_thread():
    return getattr(threading.current_thread(), "_fake_incarnation", None)


def check_alive() -> None:
    inc = actor_of_thread()
    if inc is not None and inc.dead:
        raise Dead()


def settle(fut: concurrent.futures.Future, result=None, error: BaseException | None = None):
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:  # already failed: its actor died
        pass


def copy(x):
    return pickle.loads(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))


class Ref:
    """An ObjectRef: a future, awaitable in an async actor."""

    def __init__(self, fut: concurrent.futures.Future):
        self.fut = fut
        self.id = register(self)

    def __await__(self):
        return asyncio.wrap_future(self.fut).__await__()

    def __reduce__(self):
        return (_ref, (self.id,))


class Handle:
    """An actor handle: ``handle.verb.remote(*args)``."""

    def __init__(self, actor: "Actor"):
        self._actor = actor

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__ray_ready__":  # Ray's, on every actor
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


def _ref(i: int) -> Ref:
    return OBJECTS[i]


def _handle(i: int) -> Handle:
    return OBJECTS[i].handle


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
            check_alive()
            raise RuntimeError("[fake gloo] Connection closed by peer: a member of the group "
                               "died") from None

    def broken(self) -> None:
        self.barrier.abort()
