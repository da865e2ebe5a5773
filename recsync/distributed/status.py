"""What the driver sees of the run's actors at one poll: typed, and free of Ray (the policy and
its tests use them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

ALIVE, RESTARTING, DEAD = "alive", "restarting", "dead"  # ShardStatus.state
PENDING, VACANT, LEFT = "pending", "vacant", "left"  # WorkerStatus.state of an elastic run's
# ranks: its worker asked for and not built yet; no worker; its worker drained and gone


INTERVAL_FIELDS = ("loss_sum", "loss_samples", "step_s", "interval_steps", "straggle_s",
                   "compute_s", "compute_steps", "pull_wait_s", "push_wait_s")


@dataclass
class WorkerStatus:
    """One worker's status: cumulative counts (over every process that held its rank) plus
    the loss, step time and waits since the previous poll. ``state``: created, running,
    paused, done, error, dead (its process is gone), and in elastic runs left (it drained),
    pending (asked for, not built yet) or vacant (no process)."""

    rank: int
    state: str
    error: str | None = None
    steps: int = 0
    samples: int = 0
    pid: int | None = None
    loss_sum: float = 0.0
    loss_samples: int = 0
    step_s: float = 0.0
    interval_steps: int = 0
    straggle_s: float = 0.0
    compute_s: float = 0.0
    compute_steps: int = 0  # steps with a batch of their own (compute_s is theirs)
    pull_wait_s: float = 0.0
    push_wait_s: float = 0.0
    lost_pushes: int = 0  # pushes to a shard that died before applying them (recovery on)
    leaving_since: float | None = None  # elastic runs: when it was told to leave (epoch s)

    @classmethod
    def from_dict(cls, d: dict) -> WorkerStatus:
        """From a worker's ``status()`` (keys this class does not know are left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def as_dict(self) -> dict:
        return asdict(self)

    def after(self, earlier: WorkerStatus) -> WorkerStatus:
        """This status (polled just after ``earlier``) with ``earlier``'s interval figures
        added: a worker's ``status`` starts a new interval at every call."""
        if earlier.rank != self.rank:
            raise ValueError(f"rank {earlier.rank}'s status is not rank {self.rank}'s")
        return replace(self, **{k: getattr(self, k) + getattr(earlier, k)
                                for k in INTERVAL_FIELDS})

    def per_step(self, key: str) -> float | None:
        """``key``'s time (step_s, compute_s, ...) per step over the last interval (compute
        and straggle time per step that computed)."""
        steps = self.compute_steps if key in ("compute_s", "straggle_s") else self.interval_steps
        return getattr(self, key) / steps if steps else None


@dataclass
class ShardStatus:
    """One PS shard: ``alive`` (answered), ``restarting`` (did not answer; recovery is on and
    Ray may be restarting it) or ``dead`` (gone for good: ``cause`` says why).

    ``restarted``: it answered from another process than the one the driver saw before (Ray
    restarted it, or a standby took it over, and it reloaded ``restored``); ``version_before``
    is the last version the driver saw of the process before; ``first_pull_unix``: when the
    process served its first pull (since it started, or since a rollback), if it has;
    ``node`` / ``node_before``: the node of its process now / of the process before."""

    index: int
    state: str
    cause: str | None = None
    pid: int | None = None
    version: int | None = None
    ready_unix: float | None = None
    restored: dict | None = None
    restarted: bool = False
    version_before: int | None = None
    first_pull_unix: float | None = None
    node: dict | None = None  # {node_id, node_ip} of its process (placement.where)
    node_before: dict | None = None  # of the process before, when ``restarted``


def counts_of_dead(last: dict, before: dict, completed: int, batch_size: int) -> dict:
    """A dead worker's counts ({samples, steps}): ``last``, its process's at the driver's last
    poll, or where more, the rows of the chunks the queue saw its rank complete
    (``completed``) less what its rank's earlier processes were counted (``before``): a
    process may complete chunks after the last poll that saw it alive."""
    more = completed - before["samples"] - last["samples"]
    if more <= 0:
        return last
    return {"samples": last["samples"] + more, "steps": last["steps"] + round(more / batch_size)}


def node_of(answer: dict | None) -> dict | None:
    """{node_id, node_ip} of an actor's ``where`` (or a shard's ``incarnation``) answer."""
    if not answer or "node_id" not in answer:
        return None
    return {"node_id": answer["node_id"], "node_ip": answer["node_ip"]}
