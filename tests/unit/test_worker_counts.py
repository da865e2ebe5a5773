"""A dead worker's counts: what the driver last polled, corrected by what the queue saw it
complete after that poll."""

from recsync.distributed.status import counts_of_dead


def test_chunks_completed_after_the_last_poll_are_counted():
    last = {"samples": 4096, "steps": 4}
    # the queue saw the rank complete 3 chunks of 2048 rows; 1 of them after the last poll
    counts = counts_of_dead(last, {"samples": 0, "steps": 0}, 3 * 2048, 1024)
    assert counts == {"samples": 6144, "steps": 6}


def test_earlier_processes_of_the_rank_are_not_counted_twice():
    before = {"samples": 5000, "steps": 5}  # the rank's earlier process, counted already
    counts = counts_of_dead({"samples": 2048, "steps": 2}, before, 5000 + 4096, 1024)
    assert counts == {"samples": 4096, "steps": 4}


def test_a_poll_that_saw_more_than_the_queue_completed_stands():
    """A chunk half trained when the process died is trained again by another: its rows were
    trained all the same (the poll's count), the queue has not seen it complete."""
    last = {"samples": 7000, "steps": 7}
    assert counts_of_dead(last, {"samples": 0, "steps": 0}, 6144, 1024) == last
