"""The shards' direct data path (ps/channel.py, ps/channel_server.py): messages, answers,
errors, the key, and what a client sees when the shard's process goes away. A real server on
loopback, with its handlers on an asyncio loop in a thread as in a PSShard actor; no Ray."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

from recsync.ps.channel import (KEY_BYTES, ShardChannel, ShardGone, encode, read_message,
                                send_parts)
from recsync.ps.channel_server import ChannelServer


class Handlers:
    """A pull that waits for a version (as PSShard's does), a push that raises the version."""

    def __init__(self):
        self.version = 0
        self.changed: asyncio.Event | None = None
        self.pushed: list = []

    async def pull(self, ids, min_version=0):
        while self.version < min_version:
            self.changed = self.changed or asyncio.Event()
            await self.changed.wait()
            self.changed = None
        return [np.full((len(i), 4), float(len(i)), np.float32) for i in ids], None, self.version

    async def push(self, ids, grads, dense, meta):
        if meta.get("fail"):
            raise ValueError("bad push: " + meta["fail"])
        self.pushed.append((ids, grads, dense, meta))
        self.version += 1
        if self.changed is not None:
            self.changed.set()
        return self.version

    def table(self):
        return {"pull": self.pull, "push": self.push}


def served(loop, handlers):
    return ChannelServer(handlers.table(), loop, "127.0.0.1")


@pytest.fixture
def channel(loop):
    """(handlers, their server, a client connected to it), closed after the test."""
    h = Handlers()
    server = served(loop, h)
    client = ShardChannel(server.address)
    yield h, server, client
    client.close()
    server.close()


def test_a_pull_and_a_push_carry_arrays_both_ways_unchanged(channel):
    h, _, client = channel
    ids = [np.arange(n, dtype=np.int64) * 7 for n in (3, 0, 1000)]
    rows, dense, version = client.call("pull", ids).result(timeout=10)
    assert [r.shape for r in rows] == [(3, 4), (0, 4), (1000, 4)]
    assert rows[2][999, 3] == 1000.0 and version == 0
    grads = [np.random.default_rng(0).random((len(i), 4), dtype=np.float32) for i in ids]
    dense_grad = np.linspace(0, 1, 33, dtype=np.float32)
    assert client.call("push", ids, grads, dense_grad, {"step": 5}).result(timeout=10) == 1
    got_ids, got_grads, got_dense, meta = h.pushed[0]
    for a, b in zip(got_ids + got_grads + [got_dense], ids + grads + [dense_grad]):
        assert a.dtype == b.dtype and np.array_equal(a, b)
        assert a.flags.writeable  # a shard may update what it receives in place
    assert meta == {"step": 5}


def test_arrays_arrive_aligned_for_their_type():
    a, b = np.arange(3, dtype=np.int8), np.arange(5, dtype=np.float64)
    left, right = socket.socketpair()
    send_parts(left, encode(9, (a, b)))
    request_id, (x, y) = read_message(right)
    assert request_id == 9 and np.array_equal(x, a) and np.array_equal(y, b)
    assert y.ctypes.data % 8 == 0
    left.close()
    right.close()


def test_a_pull_waiting_for_a_version_does_not_hold_up_a_push_sent_after_it(channel):
    _, _, client = channel
    ids = [np.arange(2, dtype=np.int64)]
    waiting = client.call("pull", ids, 1)
    time.sleep(0.2)
    assert not waiting.done()
    client.call("push", ids, [np.zeros((2, 4), np.float32)], None, {}).result(timeout=10)
    assert waiting.result(timeout=10)[2] == 1


def test_a_call_that_waits_goes_on_as_its_task_would_and_one_that_does_not_is_answered_at_once(
        loop):
    """Calls run at once up to their first wait (channel_server._rest_of takes over there): a
    call that waits on bare turns of the loop, on a future that fails (the call reads the
    error itself) and on one that succeeds gets its answer; an error raised after a wait is
    the caller's; calls that never wait are answered in the order sent."""
    async def waits(n):
        await asyncio.sleep(0)
        failing = loop.create_future()
        loop.call_later(0.01, failing.set_exception, KeyError("gone"))
        try:
            await failing
        except KeyError as e:
            caught = str(e)
        later = loop.create_future()
        loop.call_later(0.01, later.set_result, n)
        value = await later
        if n < 0:
            raise ValueError(f"negative after a wait: {n}")
        return caught, value, threading.current_thread() is loop_thread

    async def plain(n):
        order.append(n)
        return n

    async def current_thread():
        return threading.current_thread()

    order: list[int] = []
    loop_thread = asyncio.run_coroutine_threadsafe(current_thread(), loop).result(timeout=5)
    server = ChannelServer({"waits": waits, "plain": plain}, loop, "127.0.0.1")
    client = ShardChannel(server.address)
    try:
        assert client.call("waits", 3).result(timeout=10) == ("'gone'", 3, True)
        with pytest.raises(ValueError, match="negative after a wait: -1"):
            client.call("waits", -1).result(timeout=10)
        answers = [client.call("plain", n) for n in range(50)]
        assert [a.result(timeout=10) for a in answers] == list(range(50))
        assert order == list(range(50))
    finally:
        client.close()
        server.close()


def test_a_waiting_call_whose_task_is_cancelled_is_cancelled_inside_as_its_task_would_be(loop):
    waited = loop.create_future()
    started, ended = threading.Event(), threading.Event()

    async def forever():
        started.set()
        try:
            await waited
        finally:
            ended.set()

    async def cancel_others():
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    server = ChannelServer({"forever": forever}, loop, "127.0.0.1")
    client = ShardChannel(server.address)
    try:
        client.call("forever")
        assert started.wait(timeout=10)  # the call waits (in a task from here on)
        asyncio.run_coroutine_threadsafe(cancel_others(), loop).result(timeout=5)
        assert ended.wait(timeout=5) and waited.cancelled()
    finally:
        client.close()
        server.close()


def test_a_client_that_does_not_read_holds_up_neither_the_shard_nor_its_own_answers(loop):
    """Answers of several MB each to a client that reads nothing for a while: the shard's loop
    serves another client meanwhile, and the slow client then gets every answer whole."""
    async def echo(n, fill):
        return np.full(n, fill, np.float32)
    server = ChannelServer({"echo": echo}, loop, "127.0.0.1")
    slow = socket.create_connection((server.address["host"], server.address["port"]))
    slow.sendall(server.address["key"])
    sizes = [1 << 20, 3, 1 << 19, 1, 1 << 20, 7] * 4  # floats: 4 MB answers among small ones
    for k, n in enumerate(sizes):
        send_parts(slow, encode(k, ("echo", (n, float(k)), 0)))  # (no slot)
    other = ShardChannel(server.address)
    for k in range(20):  # while the slow client's answers wait for it
        assert other.call("echo", 2, float(k)).result(timeout=10)[1] == k
    got = dict(read_message(slow) for _ in sizes)
    assert sorted(got) == list(range(len(sizes)))
    for k, n in enumerate(sizes):
        ok, value = got[k]
        assert ok and value.shape == (n,) and (value == k).all(), k
    other.close()
    slow.close()
    server.close()


def test_answers_sent_at_once_never_cut_into_one_the_writer_thread_is_sending():
    """A large answer leaves from the writer thread, slowly (the client reads slowly); small
    answers that finish meanwhile queue behind it instead of being sent at once: every
    message arrives whole, in the order the calls finished."""
    from recsync.ps.channel_server import INLINE_BYTES, _Outbox
    for _ in range(3):  # (a cut needs an answer to finish mid-send: three tries to meet one)
        left, right = socket.socketpair()
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        left.setblocking(False)  # as the shard's loop has it
        outbox, got = _Outbox(left), []

        def read_slowly():
            while len(got) < 101:
                got.append(read_message(right))
                time.sleep(0.001)
        reader = threading.Thread(target=read_slowly)
        reader.start()
        for k in range(101):
            value = np.full(4 * INLINE_BYTES if k == 0 else 16, k, np.float32)
            outbox.send(encode(k, (True, value)))
            time.sleep(0.0005)
        reader.join(timeout=30)
        assert [request_id for request_id, _ in got] == list(range(101))
        assert all(ok and (value == k).all() for k, (_, (ok, value)) in enumerate(got))
        outbox.end()
        left.close()
        right.close()


def test_a_shards_error_is_raised_by_the_callers_result_and_the_channel_goes_on(channel):
    _, _, client = channel
    ids = [np.arange(2, dtype=np.int64)]
    with pytest.raises(ValueError, match="bad push: nan"):
        client.call("push", ids, [np.zeros((2, 4), np.float32)], None,
                    {"fail": "nan"}).result(timeout=10)
    with pytest.raises(ValueError, match="no channel verb 'die'"):
        client.call("die").result(timeout=10)
    with pytest.raises(TypeError):
        client.call("pull").result(timeout=10)  # arguments the verb does not take
    assert client.call("pull", ids).result(timeout=10)[2] == 0


def test_a_connection_without_the_key_is_closed_before_anything_is_read(loop):
    h = Handlers()
    server = served(loop, h)
    wrong = dict(server.address, key=bytes(KEY_BYTES))
    client = ShardChannel(wrong)
    future = client.call("push", [np.arange(1, dtype=np.int64)],
                         [np.zeros((1, 4), np.float32)], None, {})
    with pytest.raises(ShardGone):
        future.result(timeout=10)
    assert h.pushed == [] and server.refused == 1
    client.close()
    server.close()


def test_calls_in_flight_fail_with_shard_gone_when_the_shards_side_closes(loop):
    """A shard's process that ends closes its connections: every call waiting on one fails with
    ShardGone (the client then asks for the shard's new process), and so does the next call."""
    h = Handlers()
    server = served(loop, h)
    client = ShardChannel(server.address)
    waiting = client.call("pull", [np.arange(2, dtype=np.int64)], 5)  # never served
    time.sleep(0.2)
    server.close()  # as a process that ends closes its connections
    with pytest.raises(ShardGone):
        waiting.result(timeout=10)
    with pytest.raises(ShardGone):
        client.call("pull", [np.arange(1, dtype=np.int64)]).result(timeout=10)
    client.close()
    server.close()



# -- PSClient over the direct path ---------------------------------------------------------
def direct_shards(loop, cores):
    """Handles as PSClient sees them: ``channel.remote()`` gives each core's server address
    (``ray.get`` patched to the identity), the core's pull and push served as PSShard serves
    them."""
    from types import SimpleNamespace

    def serve(c):
        async def pull(ids, min_version=0, read_only=False, dense="vector"):
            return c.pull(ids, read_only, dense)

        async def push(ids, grads, dense_grad, meta):
            return c.push(ids, grads, dense_grad, meta)
        return ChannelServer({"pull": pull, "push": push}, loop, "127.0.0.1")
    servers = [serve(c) for c in cores]
    handles = [SimpleNamespace(channel=SimpleNamespace(remote=lambda s=s: s.address))
               for s in servers]
    return handles, servers


def steps_alike(client, local, tables, batch: int, seed: int, steps: int = 3, **close) -> None:
    """``steps`` steps of a PSClient and a LocalLookup on the same random batches: each pull
    gives the same rows (``close``: assert_close's tolerances), then the same gradients are
    pushed (the client's waited for)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        sparse = torch.stack([torch.randint(0, t.rows, (batch,), generator=gen)
                              for t in tables], 1)
        remote, here = client.pull(sparse, min_version=0), local.pull(sparse)
        torch.testing.assert_close(remote.embeddings(), here.embeddings(), **close)
        weights = torch.randn(batch, len(tables), tables[0].dim, generator=gen)
        for p in (remote, here):
            (p.embeddings().stacked * weights).sum().backward()
        client.push(remote)
        client.flush()
        local.push(here)


def test_ps_client_over_the_direct_path_equals_a_local_store(loop, monkeypatch):
    from fake_ps import patch_ray_get
    from test_ps_core import LR, SCALE, SEED, TABLES, core

    from recsync.embedding.lookup import LocalLookup
    from recsync.embedding.row_optim import RowSGD
    from recsync.embedding.store import EmbeddingStore
    from recsync.ps.client import PSClient
    patch_ray_get(monkeypatch)
    cores = [core(shard=s, num_shards=3) for s in range(3)]
    handles, servers = direct_shards(loop, cores)
    client = PSClient(handles, [t.dim for t in TABLES], push_window=2, transport="direct")
    local = LocalLookup(EmbeddingStore(TABLES, RowSGD(lr=LR), seed=SEED, init_scale=SCALE))
    steps_alike(client, local, TABLES, batch=12, seed=9, rtol=1e-5, atol=1e-6)
    assert sum(c.version for c in cores) == 9
    assert [s.connections for s in servers] == [1, 1, 1]  # one connection per shard, kept
    client.close()
    for s in servers:
        s.close()


def test_a_push_lost_with_its_shard_is_counted_and_the_client_reconnects_to_the_new_one(
        loop, monkeypatch):
    """Partial recovery: the shard's process ends (its connections close) with a push in
    flight; the push is counted lost, and the next pull goes to the shard's new process."""
    import torch
    from fake_ps import patch_ray_get
    from test_ps_core import TABLES, core

    from recsync.ps.client import PSClient
    patch_ray_get(monkeypatch)
    old = core(shard=0, num_shards=1)
    handles, servers = direct_shards(loop, [old])
    client = PSClient(handles, [t.dim for t in TABLES], push_window=4, transport="direct",
                      survive_shard_restarts=True)
    sparse = torch.stack([torch.arange(6), torch.arange(6)], 1)
    pulled = client.pull(sparse)
    (pulled.embeddings().stacked.sum()).backward()
    servers[0].close()  # the process ends before the push arrives
    client.push(pulled)
    client.flush()
    assert client.lost_pushes == 1
    new = core(shard=0, num_shards=1)  # Ray restarted it from its checkpoint
    new_handles, new_servers = direct_shards(loop, [new])
    client.shards[0] = new_handles[0]
    assert client.pull(sparse).versions == [0]
    assert new_servers[0].connections == 1
    client.close()
    new_servers[0].close()
