"""The harness's fake transport behaves as Ray does where recsync depends on it: calls in
order, copies, a death failing what is in flight and what follows, restarts with a process of
their own, a dead actor's threads stopped, a group broken by a member's death."""

import asyncio
import os
import threading
import time

import numpy as np
import pytest
import ray
import torch
import torch.distributed as dist


@ray.remote(max_restarts=0)
class Counter:
    def __init__(self, start: int):
        self.n = start
        self.reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        self.stopped_at = None

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def slow(self, s: float) -> int:
        time.sleep(s)
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def was_reconstructed(self) -> bool:
        return self.reconstructed

    def keep(self, a: np.ndarray) -> np.ndarray:
        self.kept = a
        return a

    def loop_forever(self, other) -> None:
        """A thread of this actor that calls ``other`` until it cannot."""
        def run():
            try:
                while True:
                    ray.get(other.add.remote(0))
                    time.sleep(0.01)
            finally:
                self.stopped_at = time.time()
        threading.Thread(target=run, daemon=True).start()

    def die(self) -> None:
        os._exit(1)


@ray.remote
class Waiter:
    async def ask(self, other) -> int:
        return await other.add.remote(1)

    async def nap(self) -> int:
        await asyncio.sleep(0.05)
        return 7


def test_calls_run_in_order_and_copy_their_arguments_and_answers(fake_ray):
    c = Counter.remote(0)
    refs = [c.add.remote(1) for _ in range(5)]
    assert ray.get(refs) == [1, 2, 3, 4, 5]
    a = np.zeros(3)
    back = ray.get(c.keep.remote(a))
    a[0] = 9  # the actor got a copy, as Ray serializes it
    assert back[0] == 0 and back is not a
    assert ray.get(Waiter.remote().ask.remote(c)) == 6  # an async actor awaits a ref


def test_a_death_fails_the_calls_in_flight_and_every_later_one(fake_ray):
    c = Counter.remote(0)
    in_flight = c.slow.remote(0.3)
    time.sleep(0.05)
    c.die.remote()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(in_flight)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(c.add.remote(1))


def test_a_restarted_actor_is_a_new_process_built_again(fake_ray):
    c = Counter.options(max_restarts=1).remote(10)
    ray.get(c.add.remote(5))
    pid = ray.get(c.pid.remote())
    assert not ray.get(c.was_reconstructed.remote())
    c.die.remote()
    assert ray.get(c.add.remote(0), timeout=5) == 10  # built again from its arguments
    assert ray.get(c.was_reconstructed.remote()) and ray.get(c.pid.remote()) != pid
    c.die.remote()  # no restarts left
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(c.add.remote(0), timeout=5)


def test_the_threads_of_a_dead_actor_stop_at_their_next_call(fake_ray):
    c, other = Counter.remote(0), Counter.remote(0)
    ray.get(c.loop_forever.remote(other))
    time.sleep(0.05)
    instance = c._actor.inc.instance
    c.die.remote()
    deadline = time.time() + 2
    while instance.stopped_at is None:
        assert time.time() < deadline, "the dead actor's thread went on"
        time.sleep(0.01)


def test_a_get_that_waits_too_long_times_out(fake_ray):
    c = Counter.remote(0)
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(c.slow.remote(0.5), timeout=0.05)
    d = Counter.remote(0)
    ready, left = ray.wait([d.slow.remote(0.0), d.slow.remote(5.0)], num_returns=2, timeout=0.2)
    assert len(ready) == 1 and len(left) == 1


@ray.remote
class Member:
    def __init__(self, rank: int):
        self.rank = rank

    def address(self):
        raise AssertionError("answered by the fake transport")

    def join_group(self, host, port, world):
        raise AssertionError("answered by the fake transport")

    def reduce(self, x: float) -> float:
        buf = torch.tensor([x])
        dist.all_reduce(buf)
        return float(buf[0])

    def die(self) -> None:
        os._exit(1)


def test_a_group_sums_and_a_members_death_breaks_it(fake_ray):
    a, b = Member.remote(0), Member.remote(1)
    host, port = ray.get(a.address.remote())
    ray.get([m.join_group.remote(host, port, 2) for m in (a, b)])
    assert ray.get([a.reduce.remote(1.0), b.reduce.remote(2.0)]) == [3.0, 3.0]
    waiting = a.reduce.remote(1.0)  # b never joins this round: it dies
    time.sleep(0.05)
    b.die.remote()
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        ray.get(waiting, timeout=5)
