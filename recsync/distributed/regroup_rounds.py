"""Elastic runs of shadow and foreground with MA or BMUF (``Mode.elastic_join`` is
JOIN_REPLICA_GROUP): the trainers average their replicas in rounds over a gloo group of their
own, and that group is formed again when trainers join or leave. Training never stops for it;
the trainers that stay keep their processes.

- A worker Ray built for the run waits (``actors.waiting``) until the next formation.
- A leaver drains as in every elastic mode (no new chunk, the ones it holds finished, its
  pushes applied), taking part in rounds meanwhile, so that what it trained reaches the
  others' replicas; once it has drained, or overrun ``cluster.drain_grace_s`` (then its chunk
  goes back to the queue, as elsewhere), the group is formed again without it.
- Forming: every trainer is asked to pause its rounds; the request rides in the next round's
  all-reduce, so all stop after the same round (their training threads go on; foreground: the
  thread due for a round waits). The leavers are released from the group and retired; the
  members (staying and joining) join a new gloo group; the joiners start from a staying
  trainer's replica (and BMUF's block state, the same on every trainer); every member's rounds
  go on in the new group, whose mean is over its own size.
- A death (no notice) restarts the staying trainers from a live replica on a new group, as a
  fixed run does (their group broke with it); new workers are asked for.
"""

from __future__ import annotations

import time

import ray

from recsync.distributed.actors import ACTOR_GONE, PAUSE_TIMEOUT_S
from recsync.distributed.errors import RunFailed
from recsync.distributed.regroup import Regroup
from recsync.distributed.spawn import form_group
from recsync.distributed.status import LEFT

LEFT_WAIT_S = 30  # a released leaver's training loop ends this fast (its threads are done)


class RoundsRegroup(Regroup):
    """The formations of one elastic shadow or foreground run with MA or BMUF."""

    drains = True
    unit = "round"

    def __init__(self, elastic):
        super().__init__(elastic)
        self.kept: dict | None = None  # the last trainers' replica, where all left (_ended)

    def first(self, run, built: dict[int, dict], dense_state: dict | None) -> None:
        """The run's first trainers form the group and start."""
        ranks = sorted(built)
        form_group(run.actors, ranks)
        run.start_placed(ranks, dense_state)
        self.elastic.joined_now(run, built, ranks, None)
        self._log(run, 0, ranks, ranks, [], 0.0)

    def form(self, run) -> None:
        """If workers wait to join, or leavers have drained or overrun their grace: pause every
        trainer's rounds after the same one and form the group again (the next poll tries again
        if a trainer finished or failed meanwhile)."""
        el, actors = self.elastic, run.actors
        live = actors.live()
        try:
            stand = dict(zip(live, ray.get([actors.workers[r].rounds.remote() for r in live],
                                           timeout=30)))
        except ACTOR_GONE:
            return  # a death: the next poll's
        if any(s["state"] not in ("running", "created") for s in stand.values()):
            self._ended(run, live, stand)
            return
        now = time.time()
        drained = [r for r in live if r in el.leaving and stand[r]["drained"]]
        overran = [r for r in live if r in el.leaving and r not in drained
                   and now - el.leaving[r]["unix"] > el.grace_s]
        joiners = self._answering(run, sorted(actors.waiting))
        leavers = drained + overran
        staying = [r for r in live if r not in leavers]  # leavers still draining included
        if not (leavers or joiners) or not (staying or joiners or self.kept):
            return  # nothing to do, or nobody to go on with: the leavers stay for now
        begin = time.time()
        paused = self._pause_rounds(run, live) if live else 0
        if paused is None:
            return
        try:
            source = (staying or leavers or [None])[0]
            state = (self.kept if source is None else self._replica(run, source)
                     ) if joiners else None
            self._release(run, drained, overran)
            built = {r: actors.waiting.pop(r) for r in joiners}
            members = sorted(staying + joiners)
            if members:
                form_group(actors, members)
            ray.get([actors.workers[r].rounds.remote("regroup") for r in staying], timeout=60)
            if joiners:
                run.start_placed(joiners, state)
                el.joined_now(run, built, joiners, source)
                self.kept = None
        except Exception as e:  # noqa: BLE001 - whatever broke, the trainers restart
            self._failed(run, e, staying + leavers)
            return
        self._log(run, paused, members, joiners, leavers, time.time() - begin)

    def _ended(self, run, live: list[int], stand: dict) -> None:
        """A trainer's rounds ended: every trainer's did (each was done training or drained).
        Where chunks are left (all were leavers, or one that overran its grace gave its chunk
        back after the others ran out of data), they are retired, the replica of one kept for
        the new workers asked for in their place, which train those chunks."""
        el, actors = self.elastic, run.actors
        if not all(stand[r]["state"] in (LEFT, "done") for r in live):
            return  # the others' rounds end too; a failure is the policy's
        if actors.chunks_left() == 0:
            return  # the run is over
        self.kept = self._replica(run, live[0])
        for r in live:
            if r in el.leaving:
                el.retire_leaver(run, r)
            else:
                run.retire([r])
                actors.workers[r] = None
        run.record.event(el.run_time(run, time.time()), (
            f"elastic: chunks left after every {actors.mode} trainer's rounds ended; new "
            f"workers train them, from worker {live[0]}'s replica"))
        self._log(run, 0, [], [], live, 0.0)

    def rebuild(self, run, source: int, dead: list[int]) -> str:
        """Workers ``dead`` died: the group they were in broke, so the others restart from
        ``source``'s replica on a new group (a fixed run's restart, without the dead); leavers
        among them are told again to leave; new workers are asked for. Returns the event's
        text."""
        el, actors = self.elastic, run.actors
        live = actors.live()
        survivors = [r for r in live if r not in dead]
        state = self._replica(run, source)
        for r in live:
            el.joined.pop(r, None)
        el.count_deaths(run, dead)
        run.retire(live)
        for r in dead:
            actors.workers[r] = None
        if survivors:
            run.start_workers(survivors, state)
            actors.leave([r for r in survivors if r in el.leaving])
        self._log(run, 0, survivors, [], [], 0.0, rebuilt=True)
        el.meet_target(run)
        return (f"worker(s) {dead} died; the {actors.mode} trainers {survivors} restarted from "
                f"worker {source}'s replica on a new group, their chunks requeued; new workers "
                f"asked for up to the target ({el.target})")

    # -- the parts -------------------------------------------------------------------------
    def _pause_rounds(self, run, ranks: list[int]) -> int | None:
        """Ask trainers ``ranks`` to pause their rounds and wait until all have, after the same
        round (returned). None, with their rounds going on, where one finished or failed
        meanwhile, or died."""
        actors = run.actors
        workers = [actors.workers[r] for r in ranks]
        deadline = time.time() + PAUSE_TIMEOUT_S
        try:
            ray.get([w.rounds.remote("pause") for w in workers], timeout=30)
            while True:
                stands = ray.get([w.rounds.remote() for w in workers], timeout=30)
                if any(s["state"] not in ("running", "created") for s in stands):
                    break  # the rounds ended (every trainer done), or a trainer failed
                rounds = {s["paused_after"] for s in stands}
                if None not in rounds:
                    if len(rounds) != 1:
                        raise RunFailed(f"elastic: the {actors.mode} trainers paused their "
                                        f"rounds after different rounds {sorted(rounds)}")
                    return rounds.pop()
                if time.time() > deadline:
                    raise RunFailed(f"elastic: the {actors.mode} trainers did not all pause "
                                    f"their rounds within {PAUSE_TIMEOUT_S} s")
                time.sleep(0.05)
        except ACTOR_GONE:
            pass  # a death: the next poll's
        for w in workers:
            try:
                ray.get(w.rounds.remote("resume"), timeout=30)
            except ACTOR_GONE:
                pass
        return None

    def _replica(self, run, source: int) -> dict:
        """``source``'s replica for trainers that join or restart: its parameters and BMUF's
        block state (its optimizer starts afresh, as in a fixed run's restart)."""
        state = run.actors.dense_state(source, timeout=60)
        return {"params": state["params"], "optimizer": None, "bmuf": state.get("bmuf")}

    def _release(self, run, drained: list[int], overran: list[int]) -> None:
        """The leavers leave the group (their rounds end) and are retired: the drained ones
        once their training loop has ended, the ones that overran their grace at once (their
        chunk goes back to the queue)."""
        el, actors = self.elastic, run.actors
        for r in drained + overran:
            ray.get(actors.workers[r].rounds.remote("leave"), timeout=30)
        deadline = time.time() + LEFT_WAIT_S
        for r in drained:
            while (ray.get(actors.workers[r].rounds.remote(), timeout=30)["state"]
                   in ("running", "created")) and time.time() < deadline:
                time.sleep(0.05)
            el.retire_leaver(run, r)
        for r in overran:
            el.retire_leaver(run, r, stopped=True)
