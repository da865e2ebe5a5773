"""Large answers through shared memory (ps/channel_shm.py): a real server on loopback, as in
test_channel.py; what callers get, how long a slot stays theirs, and what is left on disk."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_channel import direct_shards, steps_alike

from recsync.ps import channel_shm
from recsync.ps.channel import ShardChannel
from recsync.ps.channel_server import ChannelServer

pytestmark = pytest.mark.skipif(not os.path.isdir(channel_shm.SHM_DIR), reason="no /dev/shm")
BIG = channel_shm.MIN_BYTES // 4 * 2  # floats: an answer twice the smallest that goes in a slot


def our_files() -> list[str]:
    return [f for f in os.listdir(channel_shm.SHM_DIR) if f.startswith(f"recsync-{os.getpid()}-")]


@pytest.fixture
def echo(loop):
    """(a client, its server) whose verb ``echo(n, fill)`` answers n floats of ``fill``."""
    async def fill(n, value):
        return np.full(n, value, np.float32)
    server = ChannelServer({"echo": fill}, loop, "127.0.0.1")
    client = ShardChannel(server.address)
    yield client, server
    client.close()
    server.close()


def test_a_large_answer_arrives_in_a_slot_whose_name_is_gone_once_the_shard_mapped_it(echo):
    client, _ = echo
    answer = client.call("echo", BIG, 1.5).result(timeout=10)
    assert answer.shape == (BIG,) and (answer == 1.5).all()
    assert len(client.slots.lent) == 1  # the answer is a view of the slot, no copy
    assert our_files() == []  # the memory goes with the two mappings
    small = client.call("echo", 3, 2.0).result(timeout=10)
    assert small.tolist() == [2.0] * 3


def test_a_slot_is_not_written_again_while_the_callers_arrays_over_it_live(echo):
    client, _ = echo
    kept = [client.call("echo", BIG, float(k)).result(timeout=10) for k in range(6)]
    for k, answer in enumerate(kept):  # more than MAX_SLOTS kept: the rest came in messages
        assert (answer == k).all(), k
    assert len(client.slots.lent) == channel_shm.MAX_SLOTS
    del kept, answer
    again = client.call("echo", BIG, 9.0).result(timeout=10)
    assert (again == 9.0).all() and len(client.slots.lent) == 1  # returned slots used again


def test_slots_grow_to_the_largest_answer(echo):
    client, _ = echo
    n = channel_shm.FIRST_SLOT_BYTES // 4 + 10  # larger than the first slot
    assert (client.call("echo", n, 1.0).result(timeout=10) == 1.0).all()
    assert client.slots.want >= 4 * n
    assert (client.call("echo", n, 2.0).result(timeout=10) == 2.0).all()
    assert max(s.nbytes for s in client.slots.lent) >= 4 * n


def test_a_shard_that_cannot_map_the_slot_answers_in_messages(echo, monkeypatch):
    """As a shard on another machine: the file is not there for it."""
    def elsewhere(number, path, nbytes):
        raise FileNotFoundError(path)
    monkeypatch.setattr(channel_shm, "open_slot", elsewhere)
    client, _ = echo
    for k in range(3):
        assert (client.call("echo", BIG, float(k)).result(timeout=10) == k).all()
    assert not client.slots.enabled and client.slots.lent == [] and our_files() == []


def test_the_shard_maps_only_slot_names_in_shm(tmp_path):
    outside = tmp_path / "recsync-1-0123456789abcdef"
    outside.write_bytes(bytes(8))
    for path in (str(outside), "/dev/shm/../etc/passwd", "/dev/shm/other-name"):
        with pytest.raises(ValueError, match="not a slot's path"):
            channel_shm.open_slot(1, path, 8)


def test_an_answer_built_in_its_slot_arrives_whole_and_one_without_a_slot_is_built_apart(loop):
    """A handler builds its answer where answer_array says (a shard's pull gathers its rows
    there): the client reads it right; a call without a slot gets None and builds it apart."""
    places = []

    async def build(n, value):
        place = channel_shm.answer_array((n, 4), np.float32)
        places.append(place is not None)
        rows = place if place is not None else np.empty((n, 4), np.float32)
        rows[:] = value
        return rows, "tail"
    server = ChannelServer({"build": build}, loop, "127.0.0.1")
    client = ShardChannel(server.address)
    for k in range(3):
        rows, tail = client.call("build", BIG // 4, float(k)).result(timeout=10)
        assert rows.shape == (BIG // 4, 4) and (rows == k).all() and tail == "tail"
    client.slots.disable()
    rows, _ = client.call("build", BIG // 4, 5.0).result(timeout=10)
    assert (rows == 5.0).all() and places == [True, True, True, False]
    client.close()
    server.close()


def test_a_stores_pull_gathers_into_the_array_it_is_given():
    from recsync.embedding.row_optim import RowSGD
    from recsync.embedding.spec import TableSpec
    from recsync.embedding.store import EmbeddingStore
    store = EmbeddingStore([TableSpec(f"t{t}", 40, 4) for t in range(2)], RowSGD(lr=0.1),
                           seed=0, init_scale=0.1)
    ids = [np.array([3, 9], np.int64), np.array([0, 39, 1], np.int64)]
    expected = store.pull_arrays(ids)
    given = np.zeros((5, 4), np.float32)
    rows = store.pull_arrays(ids, out=lambda shape, dtype: given)
    assert rows.flat is given and [r.tolist() for r in rows] == [r.tolist() for r in expected]


def test_slot_files_of_makers_that_are_gone_are_removed_and_no_others():
    import subprocess
    import sys
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    made = {}
    for who, pid in (("gone", gone), ("alive", str(os.getpid()))):
        made[who] = os.path.join(channel_shm.SHM_DIR, f"recsync-{pid}-{os.urandom(8).hex()}")
        open(made[who], "wb").close()
    other = os.path.join(channel_shm.SHM_DIR, f"other-{gone}-{os.urandom(8).hex()}")
    open(other, "wb").close()
    try:
        from recsync.run.signals import pid_alive
        assert made["gone"] in channel_shm.remove_orphans(pid_alive)
        assert not os.path.exists(made["gone"])
        assert os.path.exists(made["alive"]) and os.path.exists(other)
    finally:
        for path in (*made.values(), other):
            if os.path.exists(path):
                os.unlink(path)


def test_a_ps_client_whose_answers_come_in_slots_equals_a_local_store(loop, monkeypatch):
    """Pulls large enough for slots (about 120 KB of rows per shard), pushed back, over two
    shards' direct paths: the same rows and updates as one local store, step after step."""
    from cores import test_core
    from fake_ps import patch_ray_get

    from recsync.embedding.lookup import LocalLookup
    from recsync.embedding.row_optim import RowSGD
    from recsync.embedding.spec import TableSpec
    from recsync.embedding.store import EmbeddingStore
    from recsync.ps.client import PSClient
    patch_ray_get(monkeypatch)
    written = []
    write = channel_shm.Slot.write
    monkeypatch.setattr(channel_shm.Slot, "write",
                        lambda slot, *a: written.append(slot.number) or write(slot, *a))
    tables = [TableSpec(f"t{t}", 20_000, 16) for t in range(2)]
    cores = [test_core(tables, RowSGD(lr=0.5), shard=s, num_shards=2, num_workers=1, seed=7,
                       init_scale=0.05) for s in range(2)]
    handles, servers = direct_shards(loop, cores)
    client = PSClient(handles, [t.dim for t in tables], push_window=2, transport="direct")
    local = LocalLookup(EmbeddingStore(tables, RowSGD(lr=0.5), seed=7, init_scale=0.05))
    steps_alike(client, local, tables, batch=2048, seed=3)
    assert len(written) == 3 * 2  # every pull's answer, from both shards, came in a slot
    client.close()
    for s in servers:
        s.close()
    assert our_files() == []
