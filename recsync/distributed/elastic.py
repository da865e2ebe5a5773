"""Elastic runs (``cluster.workers = [min, max]``, docs/cluster.md): the number of workers
follows a target while the run goes on, nobody restarted.

- Start: a worker is asked for every rank up to the target (``max`` at first); Ray builds each
  where and when it can place it. Training starts once ``min`` are built; the others start as
  they come (a node joined, the autoscaler added one).
- Join: a built worker starts training as its mode says (Mode.elastic_join): at once on what
  the shards hold (async, eager, gba), from a live worker's dense replica (shadow with EASGD),
  or when the group is formed again with it (sync, hybrid: regroup.py; shadow and foreground
  with MA or BMUF: regroup_rounds.py; leaves and deaths are the formation's too).
- Leave: a worker told to go (the target went down, its node is drained, or SIGTERM reached its
  process as a preemption notice) takes no chunk any more, finishes the ones it holds, pushes
  what it computed and reports "left"; then it is retired, its counts kept by its rank. One that
  has not left within ``cluster.drain_grace_s`` is stopped and its chunk goes back to the queue.
- Death: a worker lost without notice is retired at once (its chunk requeued, as today) and a
  new one is asked for while the target wants it.
- Fewer than ``min`` workers for ``cluster.below_min_timeout_s``: the run fails, naming what Ray
  could not place.

The target changes with `recsync scale` (run/scale.py). What happened goes into the record's
events, each metrics line's ``workers`` and summary.json's ``elastic`` section.
"""

from __future__ import annotations

import time

from recsync.distributed.actors import ACTOR_GONE
from recsync.distributed.errors import RunFailed
from recsync.distributed.shard_move import move_shards, run_time
from recsync.distributed.status import LEFT, WorkerStatus
from recsync.distributed.regroup import Regroup
from recsync.distributed.regroup_rounds import RoundsRegroup
from recsync.modes.base import JOIN_FROM_REPLICA, JOIN_REGROUP, JOIN_REPLICA_GROUP
from recsync.run.scale import Requests

ALIVE_STATES = ("created", "running", "paused", "done")  # a rank whose worker trains (or did)
TRAINING_STATES = ("created", "running", "paused")
MAX_DEATHS, DEATHS_WINDOW_S = 20, 600.0  # more deaths than this within the window: a crash
# loop, not a cluster whose nodes come and go (a fixed run stops after 20 in all)


class ElasticWorkers:
    """The worker count of one elastic run: its target, the workers asked for, joining and
    leaving, and what happened when (``section``)."""

    def __init__(self, cfg, facts, run_dir=None):
        """``facts``: the run's mode (recsync.modes.base.Mode)."""
        c = cfg.cluster
        self.min, self.max, self.target = c.workers_min, c.workers, c.workers
        self.grace_s, self.timeout_s = c.drain_grace_s, c.below_min_timeout_s
        config = None if run_dir is None else run_dir / "config.toml"
        # requests since the run began (it wrote config.toml then): not an earlier run's
        self.requests = Requests(run_dir, config.stat().st_mtime
                                 if config is not None and config.is_file() else None)
        self.asked: dict[int, float] = {}  # rank -> when its worker was asked for (unix)
        self.joined: dict[int, tuple] = {}  # rank -> (its join, its rank's steps before), until
        # its first step is seen
        self.leaving: dict[int, dict] = {}  # rank -> {"unix": told, "why": ...}
        self.drained_nodes: set[str] = set()
        self.moves: list[dict] = []  # planned shard moves (shard_move.py)
        self.moving = False  # a drained node may hold shards: a move is due
        self.below_since: float | None = None
        self.count: int | None = None
        self.timeline: list[dict] = []  # {time_s, workers, target}
        self.joins: list[dict] = []  # {rank, node, asked_s, started_s, first_step_s}
        self.drains: list[dict] = []  # {rank, why, time_s, drain_s, stopped}
        self.deaths: list[dict] = []  # {rank, time_s}
        self.requests_taken: list[dict] = []
        groups = {JOIN_REGROUP: Regroup, JOIN_REPLICA_GROUP: RoundsRegroup}
        group = groups.get(facts.elastic_join(cfg))
        self.group = None if group is None else group(self)

    # -- start -----------------------------------------------------------------------------
    def start(self, run, dense_state: dict | None = None) -> None:
        """Ask for a worker per rank up to the target and start training once ``min`` are
        built (RunFailed, naming what is missing, if that takes ``below_min_timeout_s``);
        ``dense_state``: where the workers hold the dense parameters, what they start from
        (a warm start's, a job checkpoint's)."""
        self.leaving.clear()  # a resumed run's workers are all new
        self.joined.clear()
        self.ask(run, [r for r, w in enumerate(run.actors.workers) if w is None][:self.target])
        deadline = time.time() + self.timeout_s
        built: dict[int, dict] = {}
        while len(built) < self.min:
            built.update(run.actors.placed())
            if time.time() > deadline:
                raise RunFailed(self._missing(run, len(built), "to start"))
            time.sleep(0.1)
        self._join(run, built, dense_state, initial=True)

    # -- every poll ------------------------------------------------------------------------
    def tend(self, run, statuses: list[WorkerStatus]) -> None:
        """Take up a new request, retire the workers that left (or overran their grace), start
        the ones built since, ask for or send away workers to meet the target, and watch the
        minimum."""
        now = time.time()
        for request in self.requests.new():
            self._take_request(run, request)
        by_rank = {s.rank: s for s in statuses}
        for s in statuses:  # told by its process's SIGTERM (a preemption notice)
            if s.leaving_since is not None and s.rank not in self.leaving:
                self.leaving[s.rank] = {"unix": s.leaving_since,
                                        "why": "SIGTERM to its process (preemption notice)"}
                run.record.event(self._t(run, now), f"elastic: worker {s.rank} leaves (SIGTERM "
                                                    f"to its process: a preemption notice)")
        for r, leave in list(self.leaving.items()):  # a group's leave is its formation's
            state = by_rank[r].state if r in by_rank else None
            if self.group is None and (state in (LEFT, "done")
                                       or now - leave["unix"] > self.grace_s):
                self._retire(run, r, stopped=state not in (LEFT, "done"), now=now)
        for r, (join, steps_before) in list(self.joined.items()):
            if r in by_rank and by_rank[r].steps > steps_before:
                join["first_step_s"] = self._t(run, now)  # within a poll (0.5 s)
                del self.joined[r]
        if self.moving:
            busy = bool(self.leaving) or any(s.state in ("done", LEFT) for s in statuses)
            move = move_shards(run, self.drained_nodes, busy)
            if move is not None:  # else: again at the next poll
                self.moving = False
                if move["shards"]:
                    self.moves.append({**move, "time_s": self._t(run, time.time())})
        if self.group is None:
            self._restart_if_work_left(run, statuses)
        self._join(run, run.actors.placed())
        self.meet_target(run)
        if self.group is not None:
            self.group.form(run)
        self._watch_minimum(run, now)

    def over(self, run, statuses: list[WorkerStatus]) -> bool:
        """Whether training is over: no worker trains and the queue has no chunk left (one a
        worker gave back after the others ran out of data is trained by a new one)."""
        if any(s.state in TRAINING_STATES for s in statuses):
            return False
        return run.actors.chunks_left() == 0

    def lost(self, run, ranks: list[int], decision) -> str:
        """Workers ``ranks`` died (the policy's REPLACE or FROM_REPLICA; REBUILD_GROUP for a
        group: regroup.py): retired, their chunks requeued; new ones are asked for while the
        target wants them. Returns the event's text."""
        if self.group is not None:
            return self.group.rebuild(run, decision.source, ranks)
        run.retire(ranks)
        for r in ranks:
            run.actors.workers[r] = None
            self.leaving.pop(r, None)
            self.joined.pop(r, None)
        self.count_deaths(run, ranks)
        self.meet_target(run)
        return (f"worker(s) {ranks} died; their chunks requeued; {len(self._live(run))} "
                f"worker(s) train on, new ones asked for up to the target ({self.target})")

    def count_deaths(self, run, ranks: list[int]) -> None:
        """Workers ``ranks`` died: in the section, and RunFailed for a crash loop."""
        now = time.time()
        for r in ranks:
            self.leaving.pop(r, None)
            self.deaths.append({"rank": r, "time_s": self._t(run, now), "unix": now})
        recent = [d for d in self.deaths if now - d["unix"] <= DEATHS_WINDOW_S]
        if len(recent) > MAX_DEATHS:
            raise RunFailed(f"{len(recent)} workers died within {DEATHS_WINDOW_S:g} s (the "
                            f"last: {ranks}); giving up. Check the worker logs for the cause.")

    def close(self, run) -> None:
        """Training is over: workers asked for and not built (or waiting for their group) are
        not wanted; those that left are retired (their counts and figures kept)."""
        run.actors.cancel(list(run.actors.pending) + list(run.actors.waiting))
        for r in list(self.leaving):
            self._retire(run, r, stopped=False, now=time.time())

    # -- the parts -------------------------------------------------------------------------
    def _take_request(self, run, request: dict) -> None:
        t = self._t(run, time.time())
        taken = {"time_s": t, "asked_s": self._t(run, request["unix"])}
        if request.get("workers") is not None:
            n = int(request["workers"])
            if not self.min <= n <= self.max:
                taken["refused"] = f"{n} is outside [{self.min}, {self.max}]"
            else:
                taken["workers"] = n
                run.record.event(t, f"elastic: target {self.target} -> {n} workers "
                                    f"(recsync scale)")
                print(f"elastic: target {self.target} -> {n} workers (recsync scale)",
                      flush=True)
                self.target = n
        for prefix in request.get("drain_nodes") or []:
            ranks = self._drain_node(run, prefix)
            taken.setdefault("drained", []).append({"node": prefix, "workers": ranks})
        self.requests_taken.append(taken)

    def _drain_node(self, run, prefix: str) -> list[int]:
        """The workers on the node whose id starts with ``prefix`` leave, workers asked for
        and not built yet are asked for elsewhere, its shards move (shard_move.py); no new
        worker goes there while the run lasts. Returns the ranks told to leave."""
        actors = run.actors
        nodes = actors.nodes()
        try:
            shard_nodes = list(actors.shard_nodes().values())
        except ACTOR_GONE:  # a shard is down: the move finds where they are when it comes
            shard_nodes = []
        ranks = [r for r, node in nodes.items() if node.startswith(prefix)
                 and r not in self.leaving]
        matched = {n for n in [*nodes.values(), *shard_nodes] if n.startswith(prefix)}
        self.drained_nodes |= matched or {prefix}
        actors.avoid_nodes(self.drained_nodes)
        again = sorted(actors.pending) + sorted(  # they might be placed there; a group's
            r for r, where in actors.waiting.items()  # built ones wait there
            if where.get("node_id", "").startswith(prefix))
        actors.cancel(again)
        self.ask(run, again)
        self._tell_to_leave(run, ranks, f"node {prefix[:8]} drained")
        self.moving = True
        return ranks

    def _tell_to_leave(self, run, ranks: list[int], why: str) -> None:
        if not ranks:
            return
        if self.group is None or self.group.drains:  # else they leave at the next formation
            run.actors.leave(ranks)
        now = time.time()
        for r in ranks:
            self.leaving[r] = {"unix": now, "why": why}
        run.record.event(self._t(run, now), f"elastic: worker(s) {ranks} told to leave ({why})")

    def retire_leaver(self, run, rank: int, stopped: bool = False) -> None:
        """A leaving worker of a group, out of it (sync: paused, its chunks handed over;
        shadow: drained, or ``stopped`` after its grace): retired."""
        self._retire(run, rank, stopped=stopped, now=time.time())

    def _retire(self, run, rank: int, stopped: bool, now: float) -> None:
        """A leaving worker retired; ``stopped``: it overran its grace (its chunk goes back to
        the queue and is trained again: ``queue.released``)."""
        leave = self.leaving.pop(rank)
        run.retire([rank])
        run.actors.workers[rank] = None
        self.joined.pop(rank, None)
        drain = {"rank": rank, "why": leave["why"], "time_s": self._t(run, leave["unix"]),
                 "drain_s": now - leave["unix"], "stopped": stopped}
        self.drains.append(drain)
        run.record.event(self._t(run, now), (
            f"elastic: worker {rank} stopped after the drain's grace "
            f"({self.grace_s:g} s); its chunk goes back to the queue" if stopped else
            f"elastic: worker {rank} left after {drain['drain_s']:.1f} s ({leave['why']})"))

    def _join(self, run, built: dict[int, dict], state: dict | None = None,
              initial: bool = False) -> None:
        """Built workers start training: from ``state``, or where the mode says, from a live
        replica (``initial``: the run's first workers, from the model they were built with).
        One built on a drained node is asked for again; if a call meets a dead actor,
        the built ones are asked for again (a death is the next poll's)."""
        stray = [r for r, where in built.items() if where.get("node_id") in self.drained_nodes]
        if stray:
            run.actors.cancel(stray)
            self.ask(run, stray)
        built = {r: where for r, where in built.items() if r not in stray}
        if not built:
            return
        if self.group is not None:  # they train once the group is formed with them
            if initial:
                self.group.first(run, built, state)
            else:
                run.actors.waiting.update(built)
            return
        ranks = sorted(built)
        live = [r for r in self._live(run) if r not in built and r not in self.leaving]
        try:
            if (state is None and not initial
                    and run.facts.elastic_join(run.cfg) == JOIN_FROM_REPLICA):
                if not live:
                    raise RunFailed("elastic run: a new worker starts from a live worker's "
                                    "dense replica, and none is left (every worker was lost)")
                state = run.actors.dense_state(live[0], timeout=60)
                state = {"params": state["params"], "optimizer": None}
            run.start_placed(ranks, state)
        except ACTOR_GONE:
            run.actors.cancel(ranks)
            self.ask(run, ranks)
            return
        self.joined_now(run, built, ranks, live[0] if state is not None and live else None)

    def joined_now(self, run, built: dict[int, dict], ranks: list[int],
                   source: int | None) -> None:
        """Workers ``ranks`` (built where ``built`` says) started training now, from worker
        ``source``'s replica (None: from what they were built with)."""
        now = time.time()
        for r in ranks:
            join = {"rank": r, "node": built[r].get("node_id"),
                    "asked_s": self._t(run, self.asked.get(r, now)),
                    "started_s": self._t(run, now), "first_step_s": None,
                    "from_replica": source}
            self.joins.append(join)
            self.joined[r] = (join, run.tallies.done_before[r]["steps"])
        if self.count is not None:
            run.record.event(self._t(run, now), f"elastic: worker(s) {ranks} joined")

    def _restart_if_work_left(self, run, statuses) -> None:
        """No worker trains but chunks are left (given back by a worker that died or was
        stopped after the others ran out of data): the workers that are done (out of their
        loop) are retired, so that new ones are asked for and train them."""
        if any(s.state in TRAINING_STATES for s in statuses):
            return
        done = [s.rank for s in statuses if s.state == "done" and s.rank not in self.leaving]
        if done and run.actors.chunks_left() > 0:
            run.retire(done)
            for r in done:
                run.actors.workers[r] = None
            run.record.event(self._t(run, time.time()), f"elastic: chunks given back after "
                                                        f"workers {done} ran out of data: new "
                                                        f"workers train them")

    def meet_target(self, run) -> None:
        """Ask for workers on vacant ranks, or send workers away, so that the workers training
        and asked for number the target (leaving ones do not count)."""
        actors = run.actors
        staying = [r for r in self._live(run) if r not in self.leaving]
        pending = sorted(actors.pending) + sorted(actors.waiting)
        more = self.target - len(staying) - len(pending)
        if more > 0:
            vacant = [r for r, w in enumerate(actors.workers) if w is None][:more]
            self.ask(run, vacant)
        elif more < 0:
            cancel = pending[::-1][:-more]
            actors.cancel(cancel)
            self._tell_to_leave(run, staying[::-1][:-more - len(cancel)],
                                f"target {self.target}")

    def ask(self, run, ranks: list[int]) -> None:
        if ranks:
            run.actors.spawn_later(ranks)
            now = time.time()
            self.asked.update({r: now for r in ranks})

    def _watch_minimum(self, run, now: float) -> None:
        have = len([r for r in self._live(run) if r not in self.leaving])
        if have >= self.min:
            self.below_since = None
            return
        if self.below_since is None:
            self.below_since = now
            run.record.event(self._t(run, now), f"elastic: {have} worker(s) train, fewer than "
                                                f"the minimum {self.min}; waiting up to "
                                                f"{self.timeout_s:g} s for more")
        elif now - self.below_since > self.timeout_s:
            raise RunFailed(self._missing(run, have, "for longer than "
                                                     f"{self.timeout_s:g} s"))

    def _missing(self, run, have: int, when: str) -> str:
        c = run.cfg.cluster
        return (f"elastic run: {have} worker(s) of the minimum {self.min} {when} "
                f"(cluster.workers = [{self.min}, {self.max}], below_min_timeout_s = "
                f"{self.timeout_s:g}): Ray could not place {len(run.actors.pending)} worker(s) "
                f"asking for {c.worker_cpus:g} CPU and {c.worker_gpus:g} GPU each; "
                f"{run.actors.free_resources()}")

    def _live(self, run) -> list[int]:
        return run.actors.live()

    def log_count(self, run, statuses) -> None:
        """The timeline gets the number of workers training (leaving ones train until they
        leave), where it changed; the console says so."""
        n = sum(s.state in ALIVE_STATES for s in statuses)
        if n != self.count:
            self.timeline.append({"time_s": self._t(run, time.time()), "workers": n,
                                  "target": self.target})
            if self.count is not None:
                print(f"elastic: {n} worker(s) train (target {self.target})", flush=True)
            self.count = n

    @staticmethod
    def _t(run, unix: float) -> float:
        return run_time(run, unix)

    def section(self) -> dict:
        """summary.json's ``elastic``."""
        firsts = [j["first_step_s"] - j["started_s"] for j in self.joins
                  if j["first_step_s"] is not None]
        return {"min": self.min, "max": self.max, "target": self.target,
                "timeline": self.timeline, "joins": self.joins, "drains": self.drains,
                "deaths": self.deaths, "requests": self.requests_taken,
                "drained_nodes": sorted(self.drained_nodes), "shard_moves": self.moves,
                "start_to_first_step_s_max": max(firsts) if firsts else None,
                "drain_s_max": max((d["drain_s"] for d in self.drains), default=None),
                "drains_stopped": sum(d["stopped"] for d in self.drains),
                "formations": None if self.group is None else self.group.formations}
