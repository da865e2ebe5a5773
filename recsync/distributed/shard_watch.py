"""What the driver knows of the shards' processes, free of Ray: the process of each shard it
last saw (a shard that answers from another one restarted), when each failed, which recoveries'
downtime is still open, and which workers an injected kill took down. The actors (actors.py)
report what they hear here; the actions read and clear it.

A failed PS shard's downtime runs from its failure (an injected kill's time, else the driver's
last answer from the old process, at most a poll before it) to the first pull that its new
process (a standby that took over, or Ray's restart) served, or, after a full recovery, the
first pull it served after the rollback. Until the driver sees that pull, the recovery's record
holds the time to the shard being ready (``downtime_to`` says which). Times are the processes'
own clocks (one machine here; on a cluster, as close as the nodes' clocks are)."""

from __future__ import annotations

import time

from recsync.distributed.status import ALIVE, ShardStatus, node_of


def restarted(before: dict | None, answer: dict) -> bool:
    """Whether a shard's ``answer`` (its ``incarnation``) comes from another process than the
    one the driver saw ``before`` (None: this is its first answer)."""
    return before is not None and before["pid"] != answer["pid"]


class ShardWatch:
    """The shards' processes as the driver saw them, and the kills not yet recovered."""

    def __init__(self):
        self.shard_seen: dict[int, dict] = {}  # each shard's incarnation the driver last saw
        self.killed_at: dict[int, float] = {}  # shard -> epoch seconds of its failure (until
        # it is recovered): an injected kill's time, else the driver's last answer from it
        self.shard_answered: dict[int, float] = {}  # shard -> epoch s of its last answer
        self.downtime_open: dict[int, tuple] = {}  # shard -> its recovery, until a pull served
        self.killed_workers: set[int] = set()  # ranks killed by injection, not yet restarted
        self.planned: dict[int, int] = {}  # shard -> its version when a planned move stopped
        # it (distributed/shard_move.py), until its take-over is logged

    def seen(self, i: int, inc: dict, now: float | None = None) -> ShardStatus:
        """Shard ``i`` answered ``inc`` (its ``incarnation``) at ``now`` (default: the clock):
        its status, ``restarted`` until ``acknowledge`` d."""
        now = time.time() if now is None else now
        before = self.shard_seen.get(i)
        again = restarted(before, inc)
        if again:  # unless a kill was injected, the old process failed after its last
            # answer (at most a poll, 0.5 s, before it): its downtime counts from then
            self.killed_at.setdefault(i, self.shard_answered.get(i, now))
        else:
            self.shard_seen[i] = inc
            self.shard_answered[i] = now
            self.downtime_ends(i, inc["first_pull_unix"])
        return ShardStatus(i, ALIVE, pid=inc["pid"], version=inc["version"],
                           ready_unix=inc["ready_unix"], restored=inc["restored"],
                           restarted=again, first_pull_unix=inc["first_pull_unix"],
                           version_before=None if before is None else before["version"],
                           node=node_of(inc), node_before=node_of(before))

    def acknowledge(self, s: ShardStatus) -> None:
        """The restart of shard ``s`` is dealt with: its new process is the one seen."""
        self.shard_seen[s.index] = {"pid": s.pid, "version": s.version,
                                    "ready_unix": s.ready_unix, "restored": s.restored,
                                    **(s.node or {})}

    def moved(self, i: int, pid: int) -> bool:
        """Whether shard ``i`` answered from process ``pid`` though the driver saw another."""
        return i in self.shard_seen and pid != self.shard_seen[i]["pid"]

    def move_planned(self, shard: int, version: int) -> None:
        """Shard ``shard`` is stopped on purpose at ``version`` (a planned move)."""
        self.planned[shard] = version

    # -- kills ---------------------------------------------------------------------------
    def killed(self, target: str, index: int, now: float) -> None:
        """An injected kill of the worker or PS shard ``index`` (a standby's is not followed:
        its place is refilled)."""
        if target == "worker":
            self.killed_workers.add(index)
        elif target != "standby":
            self.killed_at[index] = now

    def workers_started(self, ranks: list[int]) -> None:
        """Fresh processes hold ``ranks``: a kill of them is over."""
        self.killed_workers -= set(ranks)

    def is_down(self, target: str, index: int) -> bool:
        """Whether the worker or PS shard ``index`` was killed and is not back yet (a shard:
        not yet recovered; a worker: not yet restarted; a standby's place is refilled)."""
        if target == "standby":
            return False
        return index in (self.killed_workers if target == "worker" else self.killed_at)

    def recovered(self, shard: int, default: float) -> float:
        """Shard ``shard`` is recovered: when it failed (``default`` if no time is known)."""
        return self.killed_at.pop(shard, default)

    # -- downtime ------------------------------------------------------------------------
    def downtime_starts(self, shard: int, record: dict, killed_unix: float, ready_unix: float,
                        first_pull_unix: float | None, start_unix: float,
                        after_unix: float | None = None) -> None:
        """Shard ``shard`` failed at ``killed_unix`` and was ready again at ``ready_unix``: its
        recovery ``record`` gets ``downtime_s`` now (``killed_s`` from ``start_unix``, when
        training started), to be ended by the first pull served after ``after_unix``
        (default: the failure)."""
        record.update({"killed_s": killed_unix - start_unix,
                       "downtime_s": max(0.0, ready_unix - killed_unix),
                       "downtime_to": "ready"})
        self.downtime_open[shard] = (record, killed_unix,
                                     killed_unix if after_unix is None else after_unix)
        self.downtime_ends(shard, first_pull_unix)

    def downtime_ends(self, shard: int, first_pull_unix: float | None) -> None:
        """The shard's process reports its first pull served (None: none yet)."""
        open_ = self.downtime_open.get(shard)
        if open_ is None or first_pull_unix is None:
            return
        record, killed_unix, after_unix = open_
        if first_pull_unix < after_unix:
            return
        record["downtime_s"] = first_pull_unix - killed_unix
        record["downtime_to"] = "first pull served"
        del self.downtime_open[shard]
