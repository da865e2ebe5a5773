"""Large answers through shared memory where a shard and its client share a machine (the
direct data path, ps/channel.py).

Why: a pull's answer at 2,048 ids per table is 3.4 MB; over loopback TCP the kernel copies
it twice and the receiver wakes several times, 0.53-0.60 ms a round trip against 0.28 ms
written into a shared mapping and copied out of it (`/work/probe41/shm.py`, 2026-11-28); here
neither copy is left: the shard gathers a pull's rows into the slot (``answer_array``) and the
caller's arrays are views of it (docs/benchmarks/2026-11-28-ps-shm.md).

The client makes each slot (a file in /dev/shm, its space allocated up front so that a full
/dev/shm fails here and not as a SIGBUS later), asks the shard to map it (``ATTACH``, a
message on the connection before any call that uses it) and removes its name once the shard
answered (the shard too, once it mapped it): the memory goes when both ends unmap it, also
when either process is killed; a file whose maker died before that is removed when a run ends
(``remove_orphans``, on the driver's machine). A call names a free slot for its answer; the
shard writes the answer's arrays there when they are ``MIN_BYTES`` or more and fit, else sends
them in the message as before. The slot is then lent to the caller: no call names it again
until the last array over it is gone (its reference count back to the slot's own), however
long a caller keeps them. A shard on another machine cannot open the file: the attach fails
and that connection keeps TCP alone.
"""

from __future__ import annotations

import contextvars
import mmap
import os
import re
import secrets
import sys

import numpy as np

SHM_DIR = "/dev/shm"
ATTACH, DETACH = "_attach_slot", "_detach_slot"  # verbs the connection serves itself
MIN_BYTES = 64 << 10  # an answer's arrays below this go in the message
FIRST_SLOT_BYTES = 4 << 20
MAX_SLOT_BYTES = 256 << 20  # answers above this go in the message
MAX_SLOTS = 4  # per connection: calls in flight beyond these get their answers in messages
_NAME = re.compile(r"recsync-\d+-[0-9a-f]{16}")
CALL_SLOT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("call_slot", default=None)


def answer_array(shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """Where a handler of the direct data path may build the first array of its answer: the
    start of the slot its call's answer goes to (the shard's side, ``CALL_SLOT``), so that
    sending it copies nothing; None where the call has no slot or the array does not fit."""
    slot = CALL_SLOT.get()
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if slot is None or slot.view is None or not MIN_BYTES <= nbytes <= slot.nbytes:
        return None
    return slot.view[:nbytes].view(dtype).reshape(shape)


class Slot:
    """One mapped file of ``nbytes``: made here (``create``) or opened (the shard's side)."""

    def __init__(self, number: int, path: str, nbytes: int, create: bool):
        self.number, self.path, self.nbytes = number, path, nbytes
        flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except OSError:
                    os.unlink(path)
                    raise
            elif os.fstat(fd).st_size != nbytes:
                raise ValueError(f"{path}: not a slot of {nbytes} bytes")
            self.mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        self.view = np.frombuffer(self.mm, np.uint8)
        self.linked = create  # its name still in SHM_DIR (the maker removes it)

    def write(self, raws: list, lengths: list[int], align: int) -> None:
        """``raws`` (byte views) one after another from the start, each padded to ``align``;
        one already in its place (``answer_array``'s) is not copied."""
        at, start = 0, self.view.__array_interface__["data"][0]
        for raw, n in zip(raws, lengths):
            source = np.frombuffer(raw, np.uint8)
            address = source.__array_interface__["data"][0]
            if address != start + at:
                if start <= address < start + self.nbytes:  # would be overwritten as it goes
                    raise ValueError("an answer's array in its slot but not first in it")
                self.view[at:at + n] = source
            at += n + (-n % align)

    def unused(self) -> bool:
        """No array over this slot lives (only this object refers to its view)."""
        return sys.getrefcount(self.view) <= 2  # (the attribute, and the argument)

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.unlink()
        self.view = None  # (the mapping closes only when no array is over it)
        try:
            self.mm.close()
        except BufferError:  # an array over it still lives: it goes with that
            pass


def open_slot(number: int, path: str, nbytes: int) -> Slot:
    """The shard's side of ``ATTACH``: only a slot's name in SHM_DIR, never a link; its name
    removed once mapped."""
    if os.path.dirname(path) != SHM_DIR or not _NAME.fullmatch(os.path.basename(path)):
        raise ValueError(f"not a slot's path: {path!r}")
    slot = Slot(number, path, nbytes, create=False)
    slot.linked = True
    slot.unlink()
    return slot


def remove_orphans(alive) -> list[str]:
    """Remove the slot files in SHM_DIR whose maker (the PID in the name) is gone
    (``alive(pid)``: run/signals.py pid_alive); the paths removed."""
    removed = []
    for name in os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []:
        if _NAME.fullmatch(name) and not alive(int(name.split("-")[1])):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(os.path.join(SHM_DIR, name))
            except OSError:  # another user's, or gone meanwhile
                pass
    return removed


class ClientSlots:
    """A connection's slots on the client's side (under the channel's lock)."""

    def __init__(self):
        self.enabled = os.path.isdir(SHM_DIR)
        self.free: list[Slot] = []
        self.busy: dict[int, Slot] = {}  # named by a call in flight
        self.lent: list[Slot] = []  # arrays of an answer over it live
        self.want = FIRST_SLOT_BYTES  # the size new slots get: the largest answer so far
        self._numbers = iter(range(1, 1 << 31))

    def take(self) -> tuple[Slot | None, list[Slot], bool]:
        """A slot for one call's answer, or None; the slots to detach (too small), and whether
        the slot is new (to attach first)."""
        if not self.enabled:
            return None, [], False
        returned = [s for s in self.lent if s.unused()]
        if returned:
            self.lent = [s for s in self.lent if s not in returned]
            self.free += returned
        small = [s for s in self.free if s.nbytes < self.want]
        self.free = [s for s in self.free if s.nbytes >= self.want]
        if self.free:
            slot, new = self.free.pop(), False
        elif len(self.busy) + len(self.lent) < MAX_SLOTS:
            path = os.path.join(SHM_DIR, f"recsync-{os.getpid()}-{secrets.token_hex(8)}")
            try:
                slot, new = Slot(next(self._numbers), path, self.want, create=True), True
            except OSError:  # no room in SHM_DIR (or none): answers in messages from now
                self.disable()
                return None, small, False
        else:
            return None, small, False
        self.busy[slot.number] = slot
        return slot, small, new

    def done(self, slot: Slot, answer_bytes: int, lent: bool) -> None:
        """A call's answer arrived, of ``answer_bytes`` of arrays: in ``slot`` (``lent``: its
        arrays are views of it), or in its message (the slot is free again)."""
        self.busy.pop(slot.number, None)
        need = answer_bytes + 4096  # (room for each array's padding to 8 bytes)
        if MIN_BYTES <= answer_bytes and need > self.want:
            self.want = min(MAX_SLOT_BYTES, 1 << (need - 1).bit_length())
        if not self.enabled:
            slot.close()
        elif lent:
            self.lent.append(slot)
        else:
            self.free.append(slot)

    def disable(self) -> None:
        """The shard could not map a slot (another machine): answers in messages from now."""
        self.enabled = False
        for slot in self.free:
            slot.close()
        self.free = []

    def close(self) -> None:
        self.disable()
        for slot in [*self.busy.values(), *self.lent]:
            slot.close()
        self.busy, self.lent = {}, []
