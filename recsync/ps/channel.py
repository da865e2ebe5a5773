"""The shards' direct data path (``cluster.transport = "direct"``): a worker's pulls and pushes
travel over a TCP connection of its own to each shard instead of as Ray actor calls.

Why: a Ray call to an actor costs 4-6 ms on a 2-core machine before any work is done (issue 32,
docs/benchmarks/2026-11-26-issue32-evening.md), more than a shard's own work for a batch. Here a
call is one message each way: a header, pickle protocol 5 with every array out of band (a
list of arrays joined into one, ps/packing.py), and the arrays back to back (8-byte aligned),
received in place into one buffer whose views become the arrays: no copies on either side. A
large answer's arrays go through shared memory instead where both ends share a machine
(ps/channel_shm.py). Ray still places the shards, restarts them and carries every other call;
a client learns a shard's address and key through a Ray call (``PSShard.channel``).

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

from recsync.ps import channel_shm
from recsync.ps.channel_shm import ClientSlots, Slot
from recsync.ps.packing import pack

KEY_BYTES = 32
HEADER = struct.Struct("<QQII")  # request id, pickle bytes, out-of-band buffers, their slot
# (the number of the shared-memory slot that holds the buffers; 0: they follow in the message)
MAX_BUFFERS = 1 << 16
ALIGN = 8
CONNECT_TIMEOUT_S = 30.0
IOV_MAX = 512  # buffers per sendmsg (the system's limit is 1024 on Linux)


class ShardGone(ConnectionError):
    """The connection to a shard broke: its process ended (or the network between failed)."""


class ShardCallError(RuntimeError):
    """A shard's call raised an error that could not be sent back as itself."""


# -- the wire ------------------------------------------------------------------------------
def encode(request_id: int, obj, slot: Slot | None = None) -> list:
    """The parts of one message: header, buffer lengths, pickle, the buffers padded to 8;
    the buffers written into ``slot`` instead where they fit and are large enough
    (channel_shm.MIN_BYTES). Lists of arrays in ``obj`` cross as one array each
    (ps/packing.py)."""
    raws: list = []
    data = pickle.dumps(pack(obj), protocol=5, buffer_callback=lambda b: raws.append(b.raw()))
    lengths = [r.nbytes for r in raws]
    padded = sum(n + (-n % ALIGN) for n in lengths)
    in_slot = slot is not None and channel_shm.MIN_BYTES <= padded <= slot.nbytes
    head = HEADER.pack(request_id, len(data), len(raws), slot.number if in_slot else 0)
    parts = [head, struct.pack(f"<{len(raws)}Q", *lengths), data, bytes(-len(data) % ALIGN)]
    if in_slot:
        slot.write(raws, lengths, ALIGN)
        return parts
    for r, n in zip(raws, lengths):
        parts.append(r)
        if n % ALIGN:
            parts.append(bytes(-n % ALIGN))
    return parts


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
    request_id, obj, _, _ = read_answer(sock, {})
    return request_id, obj


def read_answer(sock: socket.socket, slots: dict[int, Slot]) -> tuple[int, object, int, bool]:
    """One message: (request id, the object, its arrays' bytes, whether they came in a slot),
    its arrays views of one received buffer, or of the slot of ``slots`` (number -> Slot)
    that holds them (which stays the caller's for as long as an array over it lives)."""
    request_id, size, count, slot = HEADER.unpack(recv_exact(sock, HEADER.size))
    if count > MAX_BUFFERS or (slot and slot not in slots):
        raise ShardGone(f"a message with {count} buffers in slot {slot}: not a recsync channel")
    lengths = struct.unpack(f"<{count}Q", recv_exact(sock, 8 * count)) if count else ()
    if not slot:
        obj = decode(memoryview(recv_exact(sock, body_bytes(size, lengths))), size, lengths)
    else:
        obj = decode(memoryview(recv_exact(sock, size + (-size % ALIGN))), size, lengths,
                     memoryview(slots[slot].view))
    return request_id, obj, sum(lengths), bool(slot)


def body_bytes(size: int, lengths) -> int:
    """The bytes of a message's body: its pickle of ``size`` bytes and its buffers, each
    padded to 8."""
    return size + (-size % ALIGN) + sum(n + (-n % ALIGN) for n in lengths)


def decode(body: memoryview, size: int, lengths, store: memoryview | None = None) -> object:
    """The object of a message's body, its arrays views of ``body`` after the pickle, or of
    ``store`` from its start where given."""
    buffers, at = [], 0
    if store is None:
        store, at = body, size + (-size % ALIGN)
    for n in lengths:
        buffers.append(store[at:at + n])
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
        # request id -> (its Future, the slot its answer may come in)
        self._pending: dict[int, tuple[concurrent.futures.Future, Slot | None]] = {}
        # (reentrant: a Future failed under it runs its callbacks, ``_attached``, at once)
        self._lock = threading.RLock()
        self.slots = ClientSlots()
        self.broken: ShardGone | None = None
        threading.Thread(target=self._read, daemon=True, name="channel-client").start()

    def call(self, verb: str, *args) -> concurrent.futures.Future:
        with self._lock:
            if self.broken is not None:
                return failed(self.broken)
            slot, small, new = self.slots.take()
            for old in small:
                self._send(channel_shm.DETACH, (old.number,))
                old.close()
            if new:
                self._send(channel_shm.ATTACH, (slot.number, slot.path, slot.nbytes)
                           ).add_done_callback(lambda f, s=slot: self._attached(f, s))
            return self._send(verb, args, slot)

    def _send(self, verb: str, args: tuple, slot: Slot | None = None
              ) -> concurrent.futures.Future:
        """Send one request (under the lock); its Future."""
        if self.broken is not None:
            return failed(self.broken)
        future: concurrent.futures.Future = concurrent.futures.Future()
        request_id = next(self._ids)
        self._pending[request_id] = future, slot
        try:
            send_parts(self.sock, encode(request_id, (verb, args, slot.number if slot else 0)))
        except OSError as e:
            self._pending.pop(request_id)
            self._break(ShardGone(f"sending to the shard failed: {e}"))
            future.set_exception(self.broken)
        return future

    def _attached(self, future: concurrent.futures.Future, slot: Slot) -> None:
        """The shard mapped ``slot`` (its name can go), or could not: answers in messages."""
        with self._lock:
            slot.unlink()
            if future.exception() is not None:
                self.slots.disable()

    def pending(self) -> int:
        return len(self._pending)

    def _read(self) -> None:
        try:
            while True:
                request_id, (ok, value), nbytes, lent = read_answer(self.sock, self.slots.busy)
                with self._lock:
                    future, slot = self._pending.pop(request_id)
                    if slot is not None:
                        self.slots.done(slot, nbytes, lent)
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
                future = value = None  # the caller's now: a slot stays lent while it keeps it
        except Exception as e:  # noqa: BLE001 - whatever ends the reader fails the calls
            with self._lock:
                self._break(e if isinstance(e, ShardGone) else ShardGone(
                    f"reading from the shard failed: {e}"))

    def _break(self, error: ShardGone) -> None:
        """Fail every call in flight (under the lock)."""
        if self.broken is None:
            self.broken = error
        for future, _ in self._pending.values():
            future.set_exception(self.broken)
        self._pending.clear()
        self.slots.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            self.slots.close()


def failed(error: BaseException) -> concurrent.futures.Future:
    """A call's answer that is ``error``: raised where it is waited for (as a Ray ref's)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(error)
    return future
