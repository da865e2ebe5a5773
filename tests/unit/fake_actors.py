"""A run for unit tests without Ray: the real Ray-free parts (tallies, shard watch, record,
checkpoint rounds without a directory) around ``FakeActors``, a stand-in for
recsync/distributed/actors.py's RunActors that records the verbs called on it."""

from __future__ import annotations

from recsync.distributed.checkpoints import CheckpointRounds
from recsync.distributed.handle import DistributedRun
from recsync.distributed.shard_watch import ShardWatch
from recsync.distributed.tallies import RunTallies
from recsync.modes import MODES
from recsync.run.record import RunRecord


class FakeActors:
    """The actors' verbs the actions use, recorded in ``calls``; ``versions``: the shards'
    versions; ``states``: the steps whose dense state a replica holds; ``facts``: the mode's
    (default ``MODES[mode]``)."""

    def __init__(self, mode="async", facts=None, versions=(7, 7), states=(6, 7)):
        self.mode, self.facts = mode, facts or MODES[mode]
        self.directory, self.checkpoint_dir = None, None
        self.calls: list = []
        self.versions, self.states = list(versions), {s: {"params": s} for s in states}

    def spawn(self, ranks, dense_state=None, step_index=0):
        self.calls.append(("spawn", ranks, dense_state, step_index))

    def measure_idle(self):
        """The shards' idle CPU (emulated cluster): no processes here, nothing to measure."""

    def start(self, ranks, start_unix, dense_state=None, step_index=0):
        self.calls.append(("start", ranks))

    def retire(self, ranks, tallies):
        self.calls.append(("retire", ranks))

    def recovery_states(self, rank):
        return self.states

    def dense_state(self, rank=0, timeout=None):
        return {"params": f"replica {rank}", "optimizer": "kept?"}

    def shard_call(self, verb):
        self.calls.append(("call", verb))

    def shard_versions(self):
        return self.versions

    def advance_shards(self, step, which=None):
        self.calls.append(("advance", step, which))


def fake_run(cfg, actors: FakeActors, shard_watch: ShardWatch | None = None) -> DistributedRun:
    """A DistributedRun of ``actors`` and real Ray-free parts (``shard_watch``: a given one)."""
    record, tallies = RunRecord(), RunTallies(cfg.cluster.workers)
    shard_watch = shard_watch or ShardWatch()
    rounds = CheckpointRounds(cfg, record, actors, tallies, shard_watch, None)
    return DistributedRun(cfg, None, record, None, actors, tallies, shard_watch, rounds)


def restart_calls(ranks, dense_state=None, step_index=0) -> list:
    """The calls a restart of ``ranks`` makes: retire, then fresh workers started."""
    return [("retire", ranks), ("spawn", ranks, dense_state, step_index), ("start", ranks)]
