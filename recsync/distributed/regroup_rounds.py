"""Elastic runs of shadow and foreground with MA or BMUF (``Mode.elastic_join`` is
JOIN_REPLICA_GROUP): the trainers average their replicas in rounds over a gloo group of their
own, and that group is formed again when trainers join or leave. Training goes on while it is
formed (in foreground a round still waits for every trainer of the group, a joiner's first
round too); the trainers that stay keep their processes.

- A worker Ray built for the run waits (``actors.waiting``) until the next formation.
- A leaver drains as in every elastic mode (no new chunk, the ones it holds finished, its
  pushes applied), taking part in rounds meanwhile, so that what it trained reaches the
  others' replicas; once it has drained, or overrun ``cluster.drain_grace_s`` (then its chunk
  goes back to the queue, as elsewhere), the group is formed again without it.
- Forming: every trainer is asked to pause its rounds; the request rides in the next round's
  all-reduce, so all stop after the same round while their training goes on (foreground skips
  its rounds meanwhile). The driver does not wait for that: each poll looks, and once all have
  paused the leavers are released from the group and retired, the members (staying and
  joining) join a new gloo group, the joiners start from a staying trainer's replica (and
  BMUF's block state, the same on every trainer), and every member's rounds go on in the new
  group, whose mean is over its own size.
- A death (no notice) restarts the staying trainers from a live replica on a new group, as a
  fixed run does (their group broke with it); new workers are asked for.
"""

from __future__ import annotations

import time

import ray

from recsync.distributed.actors import ACTOR_GONE, PAUSE_TIMEOUT_S
from recsync.distributed.errors import RunFailed
from recsync.distributed.regroup import Regroup
from recsync.distributed.shard_move import run_time
from recsync.distributed.spawn import form_group
from recsync.distributed.status import LEFT

LEFT_WAIT_S = 30  # a released leaver's training loop ends this fast (its threads are done)
GROUP_WAIT_S = 300  # the new group's rounds' group: every member makes it (a joiner as it starts)
TRAINING = ("running", "created")


class RoundsRegroup(Regroup):
    """The formations of one elastic shadow or foreground run with MA or BMUF."""

    drains = True
    unit = "round"

    def __init__(self, elastic):
        super().__init__(elastic)
        self.pausing: float | None = None  # when the trainers were asked to pause (unix)
        self.slow_said = False
        self.kept: tuple[int, dict] | None = None  # (rank, its replica): every trainer's
        # rounds ended with chunks left (_ended); the new ones start from it

    def first(self, run, built: dict[int, dict], dense_state: dict | None) -> None:
        """The run's first trainers form the group and start."""
        ranks = sorted(built)
        form_group(run.actors, ranks)
        run.start_placed(ranks, dense_state)
        self.elastic.joined_now(run, built, ranks, None)
        self._log(run, 0, ranks, ranks, [], 0.0)

    def form(self, run) -> None:
        """If workers wait to join, or leavers have drained or overrun their grace: ask every
        trainer to pause its rounds; once all have (a later poll), form the group again."""
        el, actors = self.elastic, run.actors
        live = actors.live()
        try:
            stand = dict(zip(live, ray.get([actors.workers[r].rounds.remote() for r in live],
                                           timeout=30)))
        except ACTOR_GONE:
            return  # a death: the next poll's
        if any(s["state"] not in TRAINING for s in stand.values()):
            self._ended(run, live, stand)
            return
        now = time.time()
        drained = [r for r in live if r in el.leaving and stand[r]["drained"]]
        overran = [r for r in live if r in el.leaving and r not in drained
                   and now - el.leaving[r]["unix"] > el.grace_s]
        joiners = self._answering(run, sorted(actors.waiting))
        leavers = drained + overran
        staying = [r for r in live if r not in leavers]  # leavers still draining included
        due = bool(leavers or joiners) and bool(staying or joiners)
        if self.pausing is None:
            if due and live:
                self._tell(run, live, "pause")
                self.pausing, self.slow_said = now, False
            elif due:
                self.pausing = now  # nobody to pause: the joiners start from the kept replica
            else:
                return
        paused = {s["paused_after"] for s in stand.values()}
        if None in paused:  # not yet (this poll's answers may predate the request)
            if now - self.pausing > PAUSE_TIMEOUT_S and not self.slow_said:
                self.slow_said = True
                run.record.event(run_time(run, now), (
                    f"elastic: the {actors.mode} trainers have not all paused their rounds "
                    f"{now - self.pausing:.0f} s after they were asked (a round comes every "
                    f"shadow.min_interval_s, or every shadow.foreground_every iterations)"))
            return
        if len(paused) > 1:
            raise RunFailed(f"elastic: the {actors.mode} trainers paused their rounds after "
                            f"different rounds {sorted(paused)}")
        begin, self.pausing = self.pausing, None
        if not due:  # a joiner went away meanwhile
            self._tell(run, live, "resume")
            return
        try:
            source, state = self._source(run, staying or leavers) if joiners else (None, None)
            self._release(run, drained, overran)
            built = {r: actors.waiting.pop(r) for r in joiners}
            members = sorted(staying + joiners)
            form_group(actors, members)
            refs = [actors.workers[r].rounds.remote("regroup") for r in staying]
            if joiners:  # each makes the rounds' group as it starts, the others meanwhile
                run.start_placed(joiners, state)
                el.joined_now(run, built, joiners, source)
            ray.get(refs, timeout=GROUP_WAIT_S)
        except Exception as e:  # noqa: BLE001 - whatever broke, the trainers restart
            self._failed(run, e, staying + leavers)
            return
        self._log(run, paused.pop() if paused else 0, members, joiners, leavers,
                  time.time() - begin)

    def rebuild(self, run, source: int, dead: list[int]) -> str:
        """Workers ``dead`` died: the group they were in broke, so the others restart from
        ``source``'s replica on a new group (a fixed run's restart, without the dead); leavers
        among them are told again to leave; new workers are asked for. Returns the event's
        text."""
        el, actors = self.elastic, run.actors
        self.pausing = None
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
    def _ended(self, run, live: list[int], stand: dict) -> None:
        """A trainer's rounds ended: every trainer's did (each was done training or drained).
        Where chunks are left (all were leavers, or one that overran its grace gave its chunk
        back after the others ran out of data), they are retired, the replica of one kept for
        the new workers asked for in their place, which train those chunks."""
        el, actors = self.elastic, run.actors
        if not all(stand[r]["state"] in (LEFT, "done") for r in live):
            return  # the others' rounds end too; a failure is the policy's
        self.pausing = None
        if actors.chunks_left() == 0:
            return  # the run is over
        self.kept = (live[0], self._replica(run, live[0]))
        for r in live:
            el.joined.pop(r, None)
            if r in el.leaving:
                el.retire_leaver(run, r)
            else:
                run.retire([r])
                actors.workers[r] = None
        run.record.event(run_time(run, time.time()), (
            f"elastic: chunks left after every {actors.mode} trainer's rounds ended; new "
            f"workers train them, from worker {live[0]}'s replica"))

    def _tell(self, run, ranks: list[int], verb: str) -> None:
        """Trainers ``ranks`` pause or resume their rounds (one that died: the next poll's)."""
        for r in ranks:
            try:
                ray.get(run.actors.workers[r].rounds.remote(verb), timeout=30)
            except ACTOR_GONE:
                pass

    def _source(self, run, ranks: list[int]) -> tuple[int, dict]:
        """(rank, replica) that joiners start from: the first of ``ranks``, else the kept."""
        if ranks:
            return ranks[0], self._replica(run, ranks[0])
        source, self.kept = self.kept, None
        return source

    def _replica(self, run, source: int) -> dict:
        """``source``'s replica for trainers that join or restart: its parameters and BMUF's
        block state (its optimizer starts afresh, as in a fixed run's restart)."""
        state = run.actors.dense_state(source, timeout=60)
        return {"params": state["params"], "optimizer": None, "bmuf": state.get("bmuf")}

    def _release(self, run, drained: list[int], overran: list[int]) -> None:
        """The leavers leave the group (their rounds end) and are retired: the ones that overran
        their grace at once (their chunk goes back to the queue), the drained ones once their
        training loop has ended."""
        el, actors = self.elastic, run.actors
        for r in overran:
            el.retire_leaver(run, r, stopped=True)
        self._tell(run, drained, "leave")
        deadline = time.time() + LEFT_WAIT_S
        for r in drained:
            while (ray.get(actors.workers[r].rounds.remote(), timeout=30)["state"]
                   in TRAINING) and time.time() < deadline:
                time.sleep(0.05)
            el.retire_leaver(run, r)
