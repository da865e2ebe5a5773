"""Elastic runs of the modes whose workers form a process group (sync, hybrid: their
``Mode.elastic_join`` is JOIN_REGROUP). The group is formed again at its new size at a step
boundary; the workers that stay keep their processes.

- A worker Ray built for the run waits (``actors.waiting``) until the next formation.
- Forming: every worker pauses after the same step (the pause request rides in the step's
  all-reduce), its pushes applied, so each shard has applied every step and its version is the
  step the group goes on at. The leaving workers hand their leased chunks back with the rows
  they trained (the next worker to take one goes on from there: nothing trained twice, nothing
  skipped) and are retired. The members (staying and joining, by rank) form a new gloo group
  with group ranks 0..n-1, each taking its share of the same global batch
  (spawn.shares: ``train.batch_size x cluster.workers[1]`` rows a step, the first ones a row
  more where n does not divide it), the shards' step barriers wait for n pushes a step, the
  joiners start from a staying worker's dense parameters and optimizer state at that step, the
  staying ones resume.
- A death (no notice): the group is rebuilt without the dead, as a fixed run rebuilds it
  (every live worker restarted at the step the PS completed, from a live replica's state at
  that step; the rows of their leased chunks trained again), and new workers are asked for.
"""

from __future__ import annotations

import contextlib
import time

import ray

from recsync.distributed.actions import restart_group
from recsync.distributed.actors import ACTOR_GONE
from recsync.distributed.errors import RunFailed
from recsync.distributed.shard_move import run_time
from recsync.distributed.spawn import form_group

JOINER_CHECK_S = 2  # a built worker that does not answer this fast joins at a later formation
# (the driver's poll waits for it)


class Regroup:
    """The formations of one elastic group run (``elastic``: its ElasticWorkers)."""

    drains = False  # a leaver is told at its formation (not at once, to drain first)
    unit = "step"  # what a formation's ``step`` counts: the group's steps (shadow: rounds)

    def __init__(self, elastic):
        self.elastic = elastic
        self.formations: list[dict] = []  # {time_s, step, members, joined, left, pause_s}

    def first(self, run, built: dict[int, dict], dense_state: dict | None) -> None:
        """The run's first workers (or a resumed run's) form the group at the shards' step."""
        ranks = sorted(built)
        step = common_step(run.actors)
        form_group(run.actors, ranks)
        run.actors.shard_call("resize", len(ranks))
        run.start_placed(ranks, dense_state, step)
        self.elastic.joined_now(run, built, ranks, None)
        self._log(run, step, ranks, ranks, [], 0.0)

    def form(self, run) -> None:
        """If workers wait to join or were told to leave: pause every member after the same
        step and form the group again (the next poll tries again if a worker finished or
        failed meanwhile, or a shard changed). A formation that fails part way (a worker died
        or did not answer) rebuilds the group from a replica that answers."""
        el, actors = self.elastic, run.actors
        live = actors.live()
        leavers = [r for r in live if r in el.leaving]
        joiners = self._answering(run, sorted(actors.waiting))
        staying = [r for r in live if r not in leavers]
        if not (leavers or joiners) or not (staying or joiners):
            return  # nothing to do, or nobody to go on with: the leavers train on for now
        begin = time.time()
        try:
            if not run.pause_all("elastic: the group changes size"):
                return
            step = common_step(actors)
            source = (staying or leavers)[0]
            state = actors.dense_state(source, timeout=60) if joiners else None
            actors.hand_over(leavers)
            for r in leavers:
                el.retire_leaver(run, r)
            built = {r: actors.waiting.pop(r) for r in joiners}
            members = sorted(staying + joiners)
            form_group(actors, members)
            actors.shard_call("resize", len(members))
            ray.get([actors.workers[r].resume.remote(actors.mode, None, 0) for r in staying],
                    timeout=60)
            if joiners:
                run.start_placed(joiners, state, step)
                el.joined_now(run, built, joiners, source)
        except Exception as e:  # noqa: BLE001 - whatever broke, the group is rebuilt
            self._failed(run, e, staying + leavers)
            return
        self._log(run, step, members, joiners, leavers, time.time() - begin)

    def rebuild(self, run, source: int, dead: list[int]) -> str:
        """Workers ``dead`` died (the policy's REBUILD_GROUP, or a formation that failed): the
        group is rebuilt without them at the step the PS completed, from ``source``'s replica
        (actions.restart_group); new workers are asked for. Returns the event's text."""
        el, actors = self.elastic, run.actors
        live = actors.live()
        survivors = [r for r in live if r not in dead]
        for r in live:
            el.joined.pop(r, None)
        el.count_deaths(run, dead)
        step, _ = restart_group(run, source, live, survivors)
        for r in dead:
            actors.workers[r] = None
        self._log(run, step, survivors, [], [], 0.0, rebuilt=True)
        el.meet_target(run)
        return (f"worker(s) {dead} died; {actors.mode} group rebuilt with {len(survivors)} "
                f"worker(s) {survivors} at step {step} from worker {source}'s replica, their "
                f"chunks requeued; new workers asked for up to the target ({el.target})")

    def _failed(self, run, error: Exception, members: list[int]) -> None:
        """A formation broke part way: the workers that do not answer count as dead, and the
        group is rebuilt from one of its ``members`` before (a joiner's replica is not the
        group's) that answers; every live worker's leases go back to the queue."""
        actors = run.actors
        live = actors.live()
        answering = []
        for r in live:
            with contextlib.suppress(Exception):
                ray.get(actors.workers[r].where.remote(), timeout=10)
                answering.append(r)
        sources = [r for r in answering if r in members]
        if not sources:
            raise RunFailed(f"elastic: forming the {actors.mode} group again failed "
                            f"({type(error).__name__}: {error}) and no worker's replica "
                            f"answers") from error
        dead = [r for r in live if r not in answering]
        text = self.rebuild(run, sources[0], dead)
        run.record.event(run_time(run, time.time()),
                         f"elastic: forming the group again failed ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}); {text}")

    def _answering(self, run, ranks: list[int]) -> list[int]:
        """The built workers of ``ranks`` that answer now; those that died are asked for
        again, those that are slow to answer wait for the next formation."""
        if not ranks:
            return []
        actors = run.actors
        refs = {r: actors.workers[r].where.remote() for r in ranks}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=JOINER_CHECK_S)
        answering, gone = [], []
        for r, ref in refs.items():
            if ref not in ready:
                continue
            try:
                ray.get(ref)
                answering.append(r)
            except ACTOR_GONE:
                gone.append(r)
        if gone:
            actors.cancel(gone)
            self.elastic.ask(run, gone)
        return answering

    def _log(self, run, step: int, members: list[int], joined: list[int], left: list[int],
             pause_s: float, rebuilt: bool = False) -> None:
        now = time.time()
        self.formations.append({"time_s": run_time(run, now), "step": step,
                                "members": members, "joined": joined, "left": left,
                                "pause_s": pause_s, "rebuilt": rebuilt})
        if len(self.formations) > 1 and not rebuilt:
            text = (f"elastic: {run.actors.mode} group formed again at {self.unit} {step} with "
                    f"{len(members)} worker(s) {members}"
                    + (f", joined {joined}" if joined else "") + (f", left {left}" if left else "")
                    + f" ({pause_s:.1f} s)")
            run.record.event(run_time(run, now), text)
            print(text, flush=True)


def common_step(actors) -> int:
    """The step every shard is at (all paused after the same step, their pushes applied)."""
    versions = actors.shard_versions()
    if len(set(versions)) != 1:
        raise RunFailed(f"the group cannot be formed again: the shards are at different steps "
                        f"{versions}")
    return versions[0]
