"""The shard's side of the direct data path (ps/channel.py).

Connections are read on the shard's asyncio loop, which starts each request in arrival order
(as Ray starts an async actor's calls): no thread hands a request over to the loop. Answers go
out as the calls finish (a pull waiting for a version does not hold up a push behind it), from
the loop where the socket takes them at once, else from the connection's writer thread, so
that a slow client never holds the loop (``_Outbox``). Together: a call without rows 0.50 ms
before, 0.42 ms after in `bench ps` on a 2-core machine (docs/benchmarks/2026-11-27-ps-direct.md).
A call runs at once as its message is read, up to its first wait (a task takes over only
there), and a message's parts are read without a turn of the loop each: with the push's own
work, a shard's CPU per trainer step at 8 shards went from 0.91 to 0.61 ms
(docs/benchmarks/2026-11-28-shard-cpu.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import hmac
import pickle
import secrets
import select
import socket
import struct
import threading
import traceback

import numpy as np

from recsync.ps import channel_shm
from recsync.ps.channel import (HEADER, KEY_BYTES, MAX_BUFFERS, ShardCallError, body_bytes,
                                decode, encode, send_some, tune)

INLINE_BYTES = 1 << 20  # answers up to this size are sent from the shard's loop (_Outbox)


class ChannelServer:
    """Serves ``handlers`` (verb -> coroutine function) on ``loop`` to connections that show
    the key: an accept thread hands each connection to the loop, which reads its requests and
    runs them; ``address`` is what a client needs."""

    def __init__(self, handlers: dict, loop: asyncio.AbstractEventLoop, host: str):
        self.handlers, self.loop = handlers, loop
        self.key = secrets.token_bytes(KEY_BYTES)
        self.listener = socket.create_server((host, 0))
        self.address = {"host": host, "port": self.listener.getsockname()[1], "key": self.key}
        self.connections = 0
        self.refused = 0
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name="channel-accept").start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # closed
                return
            tune(sock)
            self._open.add(sock)
            self.loop.call_soon_threadsafe(self._adopt, sock)

    def _adopt(self, sock: socket.socket) -> None:
        def failed(task: asyncio.Task) -> None:
            if task.cancelled() or task.exception() is not None:
                self._open.discard(sock)
                sock.close()
        self.loop.create_task(self.loop.connect_accepted_socket(
            lambda: _Connection(self, sock), sock)).add_done_callback(failed)

    def close(self) -> None:
        """Stop listening and end every connection (their clients see ShardGone)."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
        except OSError:
            pass
        self.listener.close()
        for sock in list(self._open):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Connection(asyncio.BufferedProtocol):
    """One client's connection, read on the shard's loop: the key, then messages, each
    received in place into one buffer (``read_message``'s layout) and run as its verb's
    coroutine; each answer sent as its call finishes (``_Outbox``)."""

    def __init__(self, server: ChannelServer, sock: socket.socket):
        self.server, self.sock = server, sock
        self.transport: asyncio.Transport | None = None
        self.running: set[asyncio.Task] = set()
        self.slots: dict[int, channel_shm.Slot] = {}  # the client's, for answers (ATTACH)
        self._expect(KEY_BYTES, self._key)

    def _expect(self, n: int, then) -> None:
        self.buf = np.empty(n, np.uint8)  # (not zero-filled: every byte is received into)
        self.view, self.got, self.then = memoryview(self.buf), 0, then

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.outbox = _Outbox(self.sock)

    def connection_lost(self, exc) -> None:
        self.server._open.discard(self.sock)
        self.outbox.end()
        for slot in self.slots.values():
            slot.close()
        self.slots.clear()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.got:]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        try:
            while not self.transport.is_closing():
                while self.got == len(self.buf) and not self.transport.is_closing():
                    self.then()  # (a part of no bytes, as a message without arrays has, at once)
                # the rest of a message is most often here already (a client sends it in one
                # go): read on at once rather than a turn of the loop for each part; at the
                # next message's start, back to the loop (which knows whether one came)
                if self.then == self._header and not self.got or not self._read_on():
                    break
        except Exception:  # noqa: BLE001 - a message that is not one: the connection ends,
            self.transport.close()  # and the client's calls fail (ShardGone)

    def _read_on(self) -> bool:
        """Receive what the socket holds now into the part being read; whether it held any
        (an end or error of the connection is left to the transport's next read)."""
        try:
            got = self.sock.recv_into(self.view[self.got:])
        except (BlockingIOError, InterruptedError, ConnectionError):
            return False
        self.got += got
        return got > 0

    def _key(self) -> None:
        if not hmac.compare_digest(self.buf.tobytes(), self.server.key):
            self.server.refused += 1
            self.transport.close()
            return
        self.server.connections += 1
        self._expect(HEADER.size, self._header)

    def _header(self) -> None:
        self.request_id, self.size, count, slot = HEADER.unpack(self.view)
        if count > MAX_BUFFERS or slot:
            raise ValueError(f"a message with {count} buffers: not a recsync channel")
        self._expect(8 * count, self._lengths)

    def _lengths(self) -> None:
        self.lengths = struct.unpack(f"<{len(self.buf) // 8}Q", self.view)
        self._expect(body_bytes(self.size, self.lengths), self._body)

    def _body(self) -> None:
        verb, args, slot = decode(self.view, self.size, self.lengths)
        if verb in (channel_shm.ATTACH, channel_shm.DETACH):
            self._slot_verb(self.request_id, verb, args)
        else:
            self._call(self.request_id, verb, args, self.slots.get(slot))
        self._expect(HEADER.size, self._header)

    def _slot_verb(self, request_id: int, verb: str, args) -> None:
        """Map the client's slot (ATTACH: number, path, bytes) or unmap it (DETACH: number),
        before the calls after it: (True, None), or the error of a slot that cannot be mapped
        (a client on another machine)."""
        try:
            if verb == channel_shm.DETACH:
                slot = self.slots.pop(args[0], None)
                if slot is not None:
                    slot.close()
            else:
                self.slots[args[0]] = channel_shm.open_slot(*args)
        except (OSError, ValueError, TypeError) as e:
            self._answer(request_id, error=e)
            return
        self._answer(request_id, result=None)

    def _call(self, request_id: int, verb: str, args, slot) -> None:
        handler = self.server.handlers.get(verb)
        try:
            if handler is None:
                raise ValueError(f"no channel verb {verb!r}")
            call = handler(*args)
        except (ValueError, TypeError) as e:  # answered as the call's error
            self._answer(request_id, error=e)
            return
        context = contextvars.copy_context()  # the call's answer slot, for answer_array
        context.run(channel_shm.CALL_SLOT.set, slot)
        # the call runs at once up to its first wait, as Python 3.12's eager tasks run: most
        # calls never wait, and are answered here without a task and two turns of the loop
        try:
            waits_for = context.run(call.send, None)
        except StopIteration as done:
            self._answer(request_id, result=done.value, slot=slot)
            return
        except Exception as e:  # noqa: BLE001 - the call's error is its answer
            self._answer(request_id, error=e, slot=slot)
            return
        task = self.server.loop.create_task(_rest_of(call, waits_for), context=context)
        self.running.add(task)  # (the loop holds its tasks only weakly)
        task.add_done_callback(self.running.discard)
        task.add_done_callback(lambda t: self._answer(request_id, task=t, slot=slot))

    def _answer(self, request_id: int, task=None, error: BaseException | None = None,
                result=None, slot: channel_shm.Slot | None = None) -> None:
        """Send a call's answer: (True, its result) or (False, its error), its arrays in
        ``slot`` where they fit it."""
        if self.transport.is_closing() or (task is not None and task.cancelled()):
            return  # the client or the shard went away: nothing to answer
        if task is not None:
            error = task.exception()
            result = task.result() if error is None else None
        if slot is not None and slot.view is None:  # detached while the call ran
            slot = None
        try:
            parts = encode(request_id, (True, result) if error is None
                           else (False, _portable(error)), slot)
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            parts = encode(request_id, (False, _portable(e)))
        self.outbox.send(parts)


class _Outbox:
    """A connection's answers, in the order the calls finish. An answer up to INLINE_BYTES is
    sent by the shard's loop when none waits before it and the socket takes it whole at once
    (no hand-over to another thread); else it waits for the connection's writer thread, which
    sends it as the client takes it: a slow client never holds the loop, and a large answer's
    copy into the socket runs beside it. A client gone is not an error of the shard's."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.waiting: collections.deque = collections.deque()  # each an answer's byte views
        self.ending = False
        self.cond = threading.Condition()
        threading.Thread(target=self._write, daemon=True, name="channel-write").start()

    def send(self, parts: list) -> None:
        """Send one answer's ``parts`` (``encode``'s)."""
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        with self.cond:
            if not self.waiting and sum(len(v) for v in views) <= INLINE_BYTES:
                try:  # (the socket does not block: asyncio made it so)
                    views = send_some(self.sock, views)
                except OSError:  # the connection broke: the loop ends it
                    return
                if not views:
                    return
            if self.ending:
                return
            self.waiting.append(views)
            self.cond.notify()

    def end(self) -> None:
        with self.cond:
            self.ending = True
            self.cond.notify()

    def _write(self) -> None:
        writable = select.poll()
        writable.register(self.sock, select.POLLOUT)
        try:
            while True:
                with self.cond:
                    while not self.waiting and not self.ending:
                        self.cond.wait()
                    if not self.waiting:
                        return
                    views = self.waiting[0]  # stays first: answers after it queue behind it
                while views := send_some(self.sock, views):
                    writable.poll()  # (the socket does not block: the loop reads it)
                with self.cond:
                    self.waiting.popleft()
        except (OSError, ValueError):  # the connection closed (the loop closes the socket)
            pass


async def _rest_of(call, waits_for):
    """Go on with ``call``, a coroutine that was run up to a wait for ``waits_for`` (what it
    yielded: a future, or None for a bare turn of the loop), as its task would: each wait
    awaited here (its outcome the call reads itself on resuming), a cancellation thrown into
    it."""
    while True:
        try:
            if waits_for is None:
                await asyncio.sleep(0)
            else:
                waits_for._asyncio_future_blocking = False  # (as a task takes it over)
                await asyncio.wait([waits_for])
        except asyncio.CancelledError as cancelled:
            if waits_for is not None:
                waits_for.cancel()
            waits_for = _step(call.throw, cancelled)
        else:
            waits_for = _step(call.send, None)
        if isinstance(waits_for, _Done):
            return waits_for.value


class _Done:
    """A coroutine's result (a step's, which may be any value, None included)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _step(method, arg):
    """One step of a coroutine: what it yields, or _Done with its result."""
    try:
        return method(arg)
    except StopIteration as done:
        return _Done(done.value)


def _portable(error: BaseException) -> BaseException:
    """The error itself if it pickles, else one that carries its text and traceback."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 (any error that does not survive pickling)
        text = "".join(traceback.format_exception(error))
        return ShardCallError(text)
