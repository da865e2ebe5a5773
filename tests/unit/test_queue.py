"""ChunkQueue: leases, release of a dead worker's chunk, exactly-once completion (no Ray)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recsync.data import reader
from recsync.data.chunk import Chunk
from recsync.worker.queue import ChunkQueue, in_rows


def items(epochs=2, chunks=5, rows=(10, 7, 3, 12, 1)):
    """(epoch, chunk) items of a part split into chunks of the given (uneven) sizes."""
    out = []
    for e in range(epochs):
        start = 0
        for n in rows[:chunks]:
            out.append((e, Chunk("train", 0, start, start + n)))
            start += n
    return out


def test_take_hands_out_items_in_order_then_none():
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    got = []
    for _ in its:
        item = q.take(0)
        got.append(item)
        q.done(0, item)
    assert got == its
    assert q.take(0) is None
    assert q.take(1) is None
    assert q.summary()["pending"] == 0 and q.summary()["leased"] == 0


def test_empty_queue_gives_none():
    q = ChunkQueue([])
    assert q.take(0) is None
    assert q.summary() == {"pending": 0, "leased": 0, "completed": 0, "chunks": 0,
                           "completed_more_than_once": 0, "completed_never": 0,
                           "released": 0, "released_rows": 0, "dropped": 0, "by_worker": {}}


def test_drain_hands_out_nothing_more_and_lets_leases_finish():
    """Early stopping (train.patience): the pending items go, a leased one is still done."""
    its = items(epochs=2, chunks=3)
    q = ChunkQueue(its)
    held = q.take(0)
    assert q.drain() == len(its) - 1
    assert q.take(1) is None
    q.done(0, held)
    s = q.summary()
    assert (s["dropped"], s["completed"], s["completed_never"]) == (len(its) - 1, 1,
                                                                   len(its) - 1)


def test_drain_again_after_a_restore_counts_each_dropped_item_once():
    """A recovery after early stopping restores the queue and the watch loop drains it again:
    summary's dropped counts items, not drains."""
    its = items(epochs=2, chunks=3)
    q = ChunkQueue(its)
    first = q.take(0)
    q.done(0, first)
    held = q.take(0)
    before = q.state()  # the checkpoint: `held` leased, the rest pending
    q.drain()
    q.restore(before)  # a full recovery rolls back to it
    q.take(1)  # a worker took the restored lease before the next drain
    q.drain()
    q.done(1, held)
    s = q.summary()
    assert s["dropped"] == len(its) - 2 and s["completed_never"] == len(its) - 2


def test_workers_get_different_items():
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    assert [q.take(0), q.take(1), q.take(2)] == its
    assert q.summary()["leased"] == 3 and q.summary()["pending"] == 0


def test_one_lease_per_worker():
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    first = q.take(0)
    with pytest.raises(RuntimeError, match="worker 0"):
        q.take(0)
    assert q.summary()["pending"] == 2  # the refused take consumed nothing
    q.done(0, first)
    assert q.take(0) == its[1]


def test_done_with_the_wrong_item_is_rejected():
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    held = q.take(0)
    with pytest.raises(RuntimeError):
        q.done(0, its[1])
    with pytest.raises(RuntimeError):
        q.done(1, held)  # worker 1 holds nothing
    assert q.summary()["completed"] == 0
    q.done(0, held)
    with pytest.raises(RuntimeError):
        q.done(0, held)  # twice
    assert q.summary()["completed"] == 1


def test_release_puts_the_item_back_at_the_front():
    its = items(epochs=1, chunks=4)
    q = ChunkQueue(its)
    assert q.take(0) == its[0]
    assert q.take(1) == its[1]
    assert q.release(1) == [its[1]]
    assert q.summary()["leased"] == 1 and q.summary()["pending"] == 3
    assert q.take(2) == its[1]  # the next taker gets the released item, not its[2]
    assert q.take(3) == its[2]


def test_release_of_a_worker_without_a_lease_is_a_no_op():
    its = items(epochs=1, chunks=2)
    q = ChunkQueue(its)
    assert q.release(5) == []
    assert q.take(0) == its[0]


def test_a_worker_holds_one_lease_per_thread_and_its_death_releases_all_of_them():
    its = items(epochs=1, chunks=4)
    q = ChunkQueue(its)
    a, b = q.take(0, slot=0), q.take(0, slot=1)
    with pytest.raises(RuntimeError):
        q.take(0, slot=1)  # slot 1 already holds b
    with pytest.raises(RuntimeError):
        q.done(0, a, slot=1)  # a is slot 0's
    assert q.release(0) == [a, b]
    assert [q.take(1), q.take(2)] == [a, b]  # back at the front, in their order


def test_worker_death_mid_run_still_completes_every_item_exactly_once():
    its = items(epochs=2, chunks=5)
    q = ChunkQueue(its)
    # workers 0 and 1 alternate; worker 1 dies while holding its third chunk
    for _ in range(2):
        for w in (0, 1):
            q.done(w, q.take(w))
    q.done(0, q.take(0))
    lost = q.take(1)
    assert q.release(1) == [lost]  # the driver saw worker 1 die
    survivor_chunks = []
    while (item := q.take(0)) is not None:
        survivor_chunks.append(item)
        q.done(0, item)
    assert survivor_chunks[0] == lost

    s = q.summary()
    assert s["completed"] == s["chunks"] == len(its)
    assert s["completed_more_than_once"] == 0 and s["completed_never"] == 0
    assert s["released"] == 1 and s["released_rows"] == lost[1].rows
    assert s["pending"] == 0 and s["leased"] == 0
    assert set(q.completed) == set(its) and set(q.completed.values()) == {1}
    # worker 1 completed only its first two chunks: its[1], its[3]
    w1 = [its[1], its[3]]
    w0 = [i for i in its if i not in w1]
    assert s["by_worker"] == {
        "0": {"chunks": len(w0), "samples": sum(c.rows for _, c in w0)},
        "1": {"chunks": 2, "samples": sum(c.rows for _, c in w1)},
    }
    assert sum(v["samples"] for v in s["by_worker"].values()) == sum(c.rows for _, c in its)


def test_summary_exposes_an_item_completed_twice():
    """completed_more_than_once is the exactly-once check: it must count a repeat, not hide it
    (here the same item was queued twice)."""
    its = items(epochs=1, chunks=2)
    q = ChunkQueue([its[0], its[1], its[0]])
    while (item := q.take(0)) is not None:
        q.done(0, item)
    s = q.summary()
    assert s["completed"] == 3 and s["completed_more_than_once"] == 1
    assert s["chunks"] == 2 and s["completed_never"] == 0
    assert s["by_worker"]["0"] == {"chunks": 3, "samples": 2 * its[0][1].rows + its[1][1].rows}


def test_summary_counts_items_never_completed():
    """completed_never: an item still pending or leased, or one a restore dropped from the
    position, is not done; the count shows it."""
    its = items(epochs=1, chunks=4)
    q = ChunkQueue(its)
    q.done(0, q.take(0))
    q.take(1)  # leased, never done
    assert q.summary()["completed_never"] == 3
    state = q.state()
    state["pending"] = state["pending"][1:]  # a position that lost an item
    q.restore(state)
    while (item := q.take(0)) is not None:
        q.done(0, item)
    s = q.summary()
    assert s["pending"] == 0 and s["leased"] == 0 and s["completed_more_than_once"] == 0
    assert s["completed_never"] == 1 and s["chunks"] == 4


def test_the_queue_module_does_not_import_torch():
    """The queue actor's process stays small: Chunk lives apart from the reader."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", "import recsync.worker.queue as q, sys; "
         "print(q.__file__); print('torch' in sys.modules)"],
        cwd=root, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert Path(out[0]).resolve().is_relative_to(root)  # this checkout's, not an installed one
    assert out[1] == "False"


def test_the_reader_still_hands_out_the_same_chunk():
    assert reader.Chunk is Chunk
    assert Chunk("train", 0, 3, 10).rows == 7


def test_a_hand_over_puts_the_item_back_first_with_the_rows_trained_and_releases_nothing():
    """A worker leaving an elastic sync run, paused mid-chunk: the next taker goes on from
    the rows it trained, so no row is trained twice and none is skipped."""
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    first = q.take(0)
    q.take(1)
    assert q.hand_over(0, {0: 6}) == [first]
    assert q.take_with_skip(2) == (first, 6)
    assert q.take_with_skip(0) == (its[2], 0)
    assert q.summary()["released"] == 0 and q.summary()["released_rows"] == 0
    q.hand_over(1, {})  # nothing trained of it yet: taken again from its start
    assert q.take_with_skip(3) == (its[1], 0)


def test_the_data_position_counts_rows_and_an_older_one_in_batches_is_converted():
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    q.take(0)
    state = q.state({(0, 0): 4})
    assert state["position_unit"] == "rows" and state["leased"][0][1] == 4
    assert in_rows(state, 64) is state
    older = {k: v for k, v in state.items() if k != "position_unit"}  # written in batches
    converted = in_rows(older, 64)
    assert converted["leased"][0][1] == 256 and converted["position_unit"] == "rows"
    fresh = ChunkQueue(its)
    fresh.restore(converted)
    assert fresh.take_with_skip(0) == (its[0], 256)
    with pytest.raises(ValueError, match="'bytes', not rows"):
        in_rows({**state, "position_unit": "bytes"}, 64)


def test_a_handed_over_item_still_pending_keeps_its_rows_in_the_data_position():
    """A job checkpoint taken while a handed-over chunk waits in the queue: a resumed run goes
    on from the row the leaver reached, not from the chunk's start."""
    its = items(epochs=1, chunks=3)
    q = ChunkQueue(its)
    first = q.take(0)
    q.hand_over(0, {0: 5})
    fresh = ChunkQueue(its)
    fresh.restore(q.state())
    assert fresh.take_with_skip(1) == (first, 5)


def test_a_job_checkpoint_with_a_bad_pending_skip_is_refused_naming_the_key():
    from recsync.checkpoint.meta_check import check
    q = ChunkQueue(items(epochs=1, chunks=2))
    good = q.state()
    check({"queue": good}, 3, "job/3")
    with pytest.raises(ValueError, match=r"job/3.*pending_skip"):
        check({"queue": {**good, "pending_skip": [["x", 5]]}}, 3, "job/3")
    with pytest.raises(ValueError, match=r"job/3.*position_unit"):
        check({"queue": {**good, "position_unit": "bytes"}}, 3, "job/3")
