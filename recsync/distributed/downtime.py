"""A failed PS shard's downtime: from its failure (an injected kill's time, else the driver's
last answer from the old process, at most a poll before it) to the first pull that its new
process (a standby that took over, or Ray's restart) served, or, after a full recovery, the
first pull it served after the rollback. Until the driver sees that pull, the recovery's record
holds the time to the shard being ready (``downtime_to`` says which). Times are the processes'
own clocks (one machine here; on a cluster, as close as the nodes' clocks are)."""

from __future__ import annotations


def downtime_starts(run, shard: int, record: dict, killed_unix: float, ready_unix: float,
                    first_pull_unix: float | None, after_unix: float | None = None) -> None:
    """Shard ``shard`` failed at ``killed_unix`` and was ready again at ``ready_unix``: its
    recovery ``record`` gets ``downtime_s`` now, to be ended by the first pull served after
    ``after_unix`` (default: the failure)."""
    record.update({"killed_s": killed_unix - run.start_unix,
                   "downtime_s": max(0.0, ready_unix - killed_unix), "downtime_to": "ready"})
    run.downtime_open[shard] = (record, killed_unix,
                                killed_unix if after_unix is None else after_unix)
    downtime_ends(run, shard, first_pull_unix)


def downtime_ends(run, shard: int, first_pull_unix: float | None) -> None:
    """The shard's process reports its first pull served (None: none yet)."""
    open_ = run.downtime_open.get(shard)
    if open_ is None or first_pull_unix is None:
        return
    record, killed_unix, after_unix = open_
    if first_pull_unix < after_unix:
        return
    record["downtime_s"] = first_pull_unix - killed_unix
    record["downtime_to"] = "first pull served"
    del run.downtime_open[shard]
