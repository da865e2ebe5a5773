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
address; its side is ps/channel_server.py. This module: the messages and the client.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import pickle
import socket
import struct
import threading

import numpy as np

KEY_BYTES = 32
HEADER = struct.Struct("<QQI")  # request id, pickle bytes, out-of-band buffers
MAX_BUFFERS = 1 << 16
ALIGN = 8
CONNECT_TIMEOUT_S = 30.0
IOV_MAX = 512  # buffers per sendmsg (the system's limit is 1024 on Linux)


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


def send_some(sock: socket.socket, views: list[memoryview]) -> list:
    """Send ``views`` (sendmsg may send less than asked); what is left unsent, which is
    nothing unless the socket does not block and its buffer filled up."""
    while views:
        try:
            sent = sock.sendmsg(views[:IOV_MAX])
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


def recv_exact(sock: socket.socket, n: int) -> np.ndarray:
    buf = np.empty(n, np.uint8)  # (not zero-filled: every byte is received into)
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
    return request_id, decode(memoryview(recv_exact(sock, body_bytes(size, lengths))), size,
                              lengths)


def body_bytes(size: int, lengths) -> int:
    """The bytes of a message's body: its pickle of ``size`` bytes and its buffers, each
    padded to 8."""
    return size + (-size % ALIGN) + sum(n + (-n % ALIGN) for n in lengths)


def decode(body: memoryview, size: int, lengths) -> object:
    """The object of a message's body, its arrays views of ``body``."""
    buffers, at = [], size + (-size % ALIGN)
    for n in lengths:
        buffers.append(body[at:at + n])
        at += n + (-n % ALIGN)
    return pickle.loads(body[:size], buffers=buffers)


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# -- the worker's side -----------------------------------------------------------------------
class ShardChannel:
    """One connection to one shard. ``call`` sends at once and returns a Future of the answer
    (the shard's error raised from ``result()``; ShardGone where the connection broke). Safe to
    call from several threads."""

    def __init__(self, address: dict):
        self.sock = socket.create_connection((address["host"], address["port"]),
                                             timeout=CONNECT_TIMEOUT_S)
        self.sock.settimeout(None)
        tune(self.sock)
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
