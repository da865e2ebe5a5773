"""The shards' direct data path (``cluster.transport = "direct"``): a worker's pulls and pushes
travel over a TCP connection of its own to each shard instead of as Ray actor calls.

Why: a Ray call to an actor costs 4-6 ms on a 2-core machine before any work is done (issue 32,
docs/benchmarks/2026-11-26-issue32-evening.md), more than a shard's own work for a batch. Here a
call is one message each way: a header, pickle protocol 5 with every array out of band, and the
arrays back to back (8-byte aligned), received in place into one buffer whose views become
the arrays: no copies on either side. Ray still places the shards, restarts them and carries
every other call; a client learns a shard's address and key through a Ray call (``PSShard.
channel``).

A connection first sends the shard's key (random, made when its server started): the server
closes a connection that does not, before it unpickles anything. The server binds to its node's
address. Each connection has a reader thread, which hands each request to the shard's asyncio
loop in arrival order (as Ray starts an async actor's calls); the answers go out as the calls
finish (a pull waiting for a version does not hold up a push behind it), from the loop where
the socket takes them at once, else from the connection's writer thread (a slow client never
holds the shard's loop; ``_Outbox``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hmac
import itertools
import pickle
import secrets
import socket
import struct
import threading
import traceback

KEY_BYTES = 32
HEADER = struct.Struct("<QQI")  # request id, pickle bytes, out-of-band buffers
MAX_BUFFERS = 1 << 16
ALIGN = 8
CONNECT_TIMEOUT_S = 30.0
IOV_MAX = 512  # buffers per sendmsg (the system's limit is 1024 on Linux)
INLINE_BYTES = 1 << 20  # answers up to this size are sent from the shard's loop (_Outbox)


class ShardGone(ConnectionError):
    """The connection to a shard broke: its process ended (or the network between failed)."""


class ShardCallError(RuntimeError):
    """A shard's call raised an error that could not be sent back as itself."""


# -- the wire ------------------------------------------------------------------------------
def encode(request_id: int, obj) -> list:
    """The parts of one message: header, buffer lengths, pickle, the buffers padded to 8."""
    raws: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=lambda b: raws.append(b.raw()))
    parts, lengths = [], []
    for r in raws:
        lengths.append(r.nbytes)
        parts.append(r)
        pad = -r.nbytes % ALIGN
        if pad:
            parts.append(bytes(pad))
    head = HEADER.pack(request_id, len(data), len(raws))
    pad = -len(data) % ALIGN
    return [head, struct.pack(f"<{len(raws)}Q", *lengths), data, bytes(pad), *parts]


def send_parts(sock: socket.socket, parts: list) -> None:
    """Send every byte of ``parts``."""
    send_some(sock, [memoryview(p).cast("B") for p in parts if len(p)])


def send_some(sock: socket.socket, views: list[memoryview], flags: int = 0) -> list:
    """Send ``views`` (sendmsg may send less than asked); what is left unsent, which is
    nothing unless ``flags`` has MSG_DONTWAIT and the socket's buffer filled up."""
    while views:
        try:
            sent = sock.sendmsg(views[:IOV_MAX], [], flags)
        except BlockingIOError:
            return views
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0
    return views


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ShardGone("the connection closed")
        got += k
    return buf


def read_message(sock: socket.socket) -> tuple[int, object]:
    """One message: (request id, the object), its arrays views of one received buffer."""
    request_id, size, count = HEADER.unpack(recv_exact(sock, HEADER.size))
    if count > MAX_BUFFERS:
        raise ShardGone(f"a message with {count} buffers: not a recsync channel")
    lengths = struct.unpack(f"<{count}Q", recv_exact(sock, 8 * count)) if count else ()
    padded = size + (-size % ALIGN)
    body = memoryview(recv_exact(sock, padded + sum(n + (-n % ALIGN) for n in lengths)))
    buffers, at = [], padded
    for n in lengths:
        buffers.append(body[at:at + n])
        at += n + (-n % ALIGN)
    return request_id, pickle.loads(body[:size], buffers=buffers)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# -- the shard's side ------------------------------------------------------------------------
class ChannelServer:
    """Serves ``handlers`` (verb -> coroutine function) on ``loop`` to connections that show
    the key. Runs in threads of its own; ``address`` is what a client needs."""

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
            threading.Thread(target=self._serve, args=(sock,), daemon=True,
                             name="channel-read").start()

    def _serve(self, sock: socket.socket) -> None:
        _tune(sock)
        try:
            shown = recv_exact(sock, KEY_BYTES)
        except (ShardGone, OSError):
            sock.close()
            return
        if not hmac.compare_digest(bytes(shown), self.key):
            self.refused += 1
            sock.close()
            return
        self.connections += 1
        self._open.add(sock)
        outbox = _Outbox(sock)
        try:
            while True:
                request_id, (verb, args) = read_message(sock)
                handler = self.handlers.get(verb)
                try:
                    if handler is None:
                        raise ValueError(f"no channel verb {verb!r}")
                    call = handler(*args)
                except (ValueError, TypeError) as e:  # answered as the call's error
                    outbox.answer(request_id, error=e)
                    continue
                future = asyncio.run_coroutine_threadsafe(call, self.loop)
                # (called on the shard's loop as the call finishes)
                future.add_done_callback(lambda f, r=request_id: outbox.answer(r, future=f))
        except (ShardGone, OSError):
            pass  # the client went away
        except Exception:  # noqa: BLE001 - a message that is not one: the connection ends,
            pass  # and the client sees its calls fail (ShardGone) instead of waiting for ever
        finally:
            self._open.discard(sock)
            outbox.end()  # the writer closes the socket once every answer is out

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


class _Outbox:
    """A connection's answers, in the order the calls finish. An answer is sent by the thread
    that has it (the shard's loop) when none waits before it and the socket takes it whole
    without blocking, which saves a hand-over to another thread (a tenth of a millisecond on a
    busy 2-core machine); else it waits for the connection's writer thread, so that a slow
    client never holds the shard's loop. A client gone is not an error of the shard's."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.waiting: collections.deque = collections.deque()  # each an answer's byte views
        self.ending = False
        self.cond = threading.Condition()
        threading.Thread(target=self._write, daemon=True, name="channel-write").start()

    def answer(self, request_id: int, future=None, error: BaseException | None = None) -> None:
        """Send a call's answer: (True, its result) or (False, its error)."""
        if future is not None:
            error = future.exception()
        try:
            parts = encode(request_id, (True, future.result()) if error is None
                           else (False, _portable(error)))
        except Exception as e:  # noqa: BLE001 - a result that does not pickle
            parts = encode(request_id, (False, _portable(e)))
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        with self.cond:
            if not self.waiting and sum(len(v) for v in views) <= INLINE_BYTES:
                try:
                    views = send_some(self.sock, views, socket.MSG_DONTWAIT)
                except OSError:  # the connection broke: the reader ends it
                    return
                if not views:
                    return
            self.waiting.append(views)
            self.cond.notify()

    def end(self) -> None:
        with self.cond:
            self.ending = True
            self.cond.notify()

    def _write(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.waiting and not self.ending:
                        self.cond.wait()
                    if not self.waiting:
                        return
                    views = self.waiting[0]  # stays first: answers after it queue behind it
                send_some(self.sock, views)
                with self.cond:
                    self.waiting.popleft()
        except OSError:
            pass
        finally:
            self.sock.close()


def _portable(error: BaseException) -> BaseException:
    """The error itself if it pickles, else one that carries its text and traceback."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 (any error that does not survive pickling)
        text = "".join(traceback.format_exception(error))
        return ShardCallError(text)


# -- the worker's side -----------------------------------------------------------------------
class ShardChannel:
    """One connection to one shard. ``call`` sends at once and returns a Future of the answer
    (the shard's error raised from ``result()``; ShardGone where the connection broke). Safe to
    call from several threads."""

    def __init__(self, address: dict):
        self.sock = socket.create_connection((address["host"], address["port"]),
                                             timeout=CONNECT_TIMEOUT_S)
        self.sock.settimeout(None)
        _tune(self.sock)
        self.sock.sendall(address["key"])
        self._ids = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self.broken: ShardGone | None = None
        threading.Thread(target=self._read, daemon=True, name="channel-client").start()

    def call(self, verb: str, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self.broken is not None:
                future.set_exception(self.broken)
                return future
            request_id = next(self._ids)
            self._pending[request_id] = future
            try:
                send_parts(self.sock, encode(request_id, (verb, args)))
            except OSError as e:
                self._pending.pop(request_id)
                self._break(ShardGone(f"sending to the shard failed: {e}"))
                future.set_exception(self.broken)
        return future

    def pending(self) -> int:
        return len(self._pending)

    def _read(self) -> None:
        try:
            while True:
                request_id, (ok, value) = read_message(self.sock)
                with self._lock:
                    future = self._pending.pop(request_id)
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except (ShardGone, OSError) as e:
            with self._lock:
                self._break(e if isinstance(e, ShardGone) else ShardGone(str(e)))

    def _break(self, error: ShardGone) -> None:
        """Fail every call in flight (under the lock)."""
        if self.broken is None:
            self.broken = error
        for future in self._pending.values():
            future.set_exception(self.broken)
        self._pending.clear()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
