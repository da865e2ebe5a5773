"""The contract every sync mode implements, in three parts (docs/architecture.md):

- ``WorkerMode``, the worker half: what one training step does (pull, compute, send). The worker
  (worker/worker.py) owns the one loop every mode runs: it reads batches from leased chunks,
  calls ``step(batch, ahead)``, records the loss and time, reports chunks done and pauses when
  asked. It hands the mode a ``WorkerContext`` (PS client, model replica, timers, the
  straggler hook, pause requests) instead of patching the mode's methods.
- ``ShardRule``, the server half: what a PS shard does with a push (apply at once, wait for a
  step's pushes, aggregate a global batch, ...) plus any state of the mode's own (GBA's
  buffer, EASGD's center). ``ShardCore`` (ps/core.py) holds rows, the dense vector, the
  version and snapshots, and calls the rule.
- ``Mode``, the facts the driver needs: whether workers form a process group, where the dense
  parameters live, what a dead worker means, how many samples one update holds, and the
  mode's section of summary.json.

Each part is abstract (``Contract``): a subclass that leaves a required part undefined fails
when its class statement runs, at import, not inside a shard or worker actor.

``MODES`` (modes/__init__.py) maps each name to its ``Mode``; nothing outside this package
tests a mode's name.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch

STOP = "stop"
"""returned by ``step`` when no worker has data left: the run is over for everyone. A value, not
an ``object()``: Ray may serialize the worker class by value, and identity does not survive."""

# What a dead worker means for a mode (Mode.worker_death), carried out by the driver:
REPLACE = "replace"  # a fresh worker takes the dead one's rank (all ranks if there is a group)
REBUILD_GROUP = "rebuild_group"  # every worker restarts at the step the PS completed, from a
# live replica's dense state as of that step (the shards forget the incomplete step)
FROM_REPLICA = "from_replica"  # dead ranks (all, if there is a group) restart from a live
# replica's dense parameters

# What a worker joining an elastic run (cluster.workers = [min, max]) starts from
# (Mode.elastic_join); a leave is a drain in every elastic mode: the worker finishes its chunk,
# its pushes applied, and goes (distributed/elastic.py):
JOIN_AS_IS = "as_is"  # the shards hold what it needs: it pulls and trains (async, eager, gba)
JOIN_FROM_REPLICA = "from_replica"  # it starts from a live worker's dense replica (shadow
# with EASGD or none)
JOIN_REPLICA_GROUP = "replica_group"  # as JOIN_FROM_REPLICA, and the trainers' averaging
# group is formed again, its rounds paused after the same one (shadow and foreground with MA or
# BMUF: distributed/regroup_rounds.py); a leaver drains, then leaves the group
JOIN_REGROUP = "regroup"  # every worker pauses after the same step and the group is formed
# again at its new size, with the same global batch (sync, hybrid: distributed/regroup.py); a
# leave is then no drain: the leaver's chunk goes on with the others from where it stopped


class Contract(ABCMeta):
    """The metaclass of the contract's three parts. A class statement that subclasses one and
    leaves a required part undefined (``contract_gaps``) raises TypeError: a Mode is never
    instantiated (its facts are class attributes), so ABC's own check would never run for it,
    and a worker's or a rule's would run only inside its actor. ``abstract=True`` in a class
    statement keeps a class abstract on purpose (the three bases)."""

    def __new__(mcls, name, bases, ns, abstract: bool = False, **kwargs):
        cls = super().__new__(mcls, name, bases, ns, **kwargs)
        # Only a class statement's namespace holds __qualname__. Not checked: type(name, bases,
        # ns) (the tests' facts-only modes) and cloudpickle's rebuild of a class sent by value,
        # an empty class whose attributes are set after it is made.
        if not abstract and "__qualname__" in ns:
            gaps = contract_gaps(cls)
            if gaps:
                raise TypeError(f"{cls.__module__}.{cls.__qualname__} does not define "
                                f"{'; '.join(gaps)} (the mode contract: recsync/modes/base.py)")
        return cls


_ABSTRACT = {"make_rule": "its shard rule", "step": "one training step",
             "push": "what a shard does with a push"}


def contract_gaps(cls) -> list[str]:
    """What ``cls`` (a WorkerMode, ShardRule or Mode) leaves undefined of the contract, one
    phrase each; [] when nothing."""
    gaps = [f"{name}() ({_ABSTRACT.get(name, 'required')})"
            for name in sorted(cls.__abstractmethods__)]
    if not issubclass(cls, Mode):
        return gaps
    if not isinstance(getattr(cls, "name", None), str):
        gaps.append("name (its key in MODES)")
    worker = getattr(cls, "worker", None)
    if not (isinstance(worker, type) and issubclass(worker, WorkerMode)):
        gaps.append("worker (its WorkerMode subclass)")
    elif (cls.worker_death == REBUILD_GROUP
          and worker.recovery_states is WorkerMode.recovery_states):
        gaps.append(f"{worker.__name__}.recovery_states() (worker_death = REBUILD_GROUP "
                    f"restarts the group from it)")
    return gaps


@dataclass
class WorkerContext:
    """What a worker hands its mode. Callbacks are the worker's: they count time per interval
    (metrics.jsonl), emulate stragglers and carry the driver's pause requests."""

    rank: int
    cfg: Any  # RunConfig
    model: torch.nn.Module  # this worker's dense replica (the model's dense parameters)
    client: Any  # PSClient of the worker's main thread
    new_client: Callable[[], Any]  # another PSClient (one per extra training thread)
    shards: list  # PS shard handles (for a mode's own calls, e.g. EASGD's center)
    device: torch.device = torch.device("cpu")  # where the replica computes (a GPU worker's:
    # recsync/cluster/device.py); pulled rows come there, what crosses processes goes back to host
    dense_state: dict | None = None  # {"params": flat, "optimizer": flat layout or None}
    step_index: int = 0  # sync-like modes: the global step to start at
    before_compute: Callable[[], None] = lambda: None  # the emulated cluster's pacing
    after_compute: Callable[[float], None] = lambda compute_s: None
    paced: Callable[[], Any] = contextlib.nullcontext  # a section of work outside the steps
    # (a shadow round), paced on the worker's emulated cores
    pause_requested: Callable[[], bool] = lambda: False
    add_waits: Callable[[float, float], None] = lambda pull_s, push_s: None
    all_reduce: Callable[[torch.Tensor], None] | None = None  # sums a tensor over the
    # workers' group in place; None: torch.distributed's (the simulator gives its own)
    now: Callable[[], float] = time.perf_counter  # the clock a mode's own waits are timed
    # on (add_waits); the simulator's: simulated seconds


class WorkerMode(metaclass=Contract, abstract=True):
    """The worker half of a mode (``step`` required).

    ``step(batch, ahead, thread)`` runs one step on ``batch`` (None: this worker has no data
    left) and returns the batch's mean loss, None (a step without a batch of this worker's), or
    STOP (the run is over for this thread). ``ahead`` is the next batch when ``lookahead`` is
    set (eager sends its pull early), else None. ``threads`` training threads run the same loop
    on one replica, each with its own batches (Hogwild); ``run`` drives them.
    """

    lookahead: ClassVar[bool] = False
    threads: int = 1

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx

    @abstractmethod
    def step(self, batch, ahead=None, thread: int = 0):
        """One step (see the class docstring)."""

    def run(self, steps: list[Callable[[], bool]]) -> None:
        """Run the training threads: ``steps[i]()`` does one step of thread i and returns
        False once that thread is done. Default: one thread, here."""
        while steps[0]():
            pass

    def agreed_pause(self) -> bool:
        """After a step: whether to pause now. Default: as soon as the driver asked."""
        return self.ctx.pause_requested()

    def finish(self, thread: int = 0) -> None:
        """Every push of training thread ``thread`` applied (nothing in flight crosses a pause
        or the end of the run)."""
        self.ctx.client.flush()

    def dense_state(self) -> dict | None:
        """The dense parameters this worker holds ({"params": flat float32, "optimizer": the
        optimizer's state in the PS's flat layout, or None}), or None where the PS holds them.
        Job checkpoints, switching and replica restarts use it."""
        return None

    def recovery_states(self) -> dict[int, dict]:
        """REBUILD_GROUP modes: {step: dense state as of that step's start} for the steps this
        replica can still tell (a rebuilt group starts at the step the PS completed)."""
        raise RuntimeError(f"{type(self).__name__} keeps no per-step dense states")

    def stats(self) -> dict | None:
        """This worker's figures for the mode's summary section (Mode.summary), or None."""
        return None


class ShardRule(metaclass=Contract, abstract=True):
    """The server half of a mode: what a shard does with a push (``push`` required), and the
    state it keeps for that. ``core`` is the shard's ShardCore (rows, dense vector, version)."""

    @abstractmethod
    def push(self, core, ids: list[np.ndarray], grads: list[np.ndarray],
             dense_grad: np.ndarray | None, meta: dict) -> Any:
        """Apply (or keep) one worker's push; ``meta`` holds what the worker's half sends with
        it (the version it read, its sample count, a step number, ...). Returns what the
        worker's half reads back (async: the update's staleness)."""

    def end(self, core) -> int:
        """The run is over, or the mode is left: apply whatever is still held. Returns how
        many gradients that was."""
        return 0

    def drop_incomplete(self, core) -> int:
        """Forget gradients of updates that will never complete (their worker died). Returns
        how many."""
        return 0

    def buffered(self) -> int:
        """Gradients held, not applied yet."""
        return 0

    def model_dense(self, core) -> np.ndarray | None:
        """The dense parameters of the trained model if this shard holds them (the core's
        dense vector; EASGD: its center copy), else None."""
        return None if core.dense is None else core.dense.params.detach().numpy().copy()

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, meta) of this rule's state for a shard checkpoint."""
        return {}, {}

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Back to a ``snapshot``; gradients held now are dropped."""

    def stats(self) -> dict:
        """Counters of this rule for the shard's stats (merged into them)."""
        return {}


class Mode(metaclass=Contract, abstract=True):
    """A mode's parts and the facts the driver needs about it. Subclasses set the class
    attributes (``name`` and ``worker`` required) and define ``make_rule``; the classmethods
    take the run's config."""

    name: ClassVar[str]
    worker: ClassVar[type[WorkerMode]]
    dense_on_ps: ClassVar[bool] = False  # PS shard 0 holds the dense parameters
    lockstep: ClassVar[bool] = False  # the shards apply each step together: a shard rolled
    # back alone would stall the others (no partial recovery)
    pauses_for_checkpoint: ClassVar[bool] = False  # workers pause after the same step for a
    # checkpoint round, so replicas, shards and data position agree exactly
    worker_death: ClassVar[str] = REPLACE
    switchable: ClassVar[bool] = False  # a run may switch to and from it (distributed/
    # switching.py moves the dense state between the workers' replicas and PS shard 0)
    reports_waits: ClassVar[bool] = False  # per-step pull and push waits in metrics.jsonl
    shadow_thread: ClassVar[bool] = False  # a background thread synchronizes the workers
    summary_key: ClassVar[str | None] = None  # its section of summary.json
    gpu_workers: ClassVar[bool] = False  # its workers can compute on a GPU
    # (recsync/cluster/device.py)
    joins: ClassVar[str | None] = None  # what a joining worker starts from (elastic_join)
    simulated: ClassVar[bool] = True  # `recsync simulate` runs it (recsync/simulation)

    @classmethod
    def needs_group(cls, cfg) -> bool:
        """Whether the workers form a gloo process group."""
        return False

    @classmethod
    def not_simulated(cls, cfg) -> str | None:
        """A setting of ``cfg`` that `recsync simulate` does not model for this mode (named in
        its refusal), or None."""
        return None

    @classmethod
    def quiet_when_paused(cls, cfg) -> bool:
        """Whether a pause of every worker (after a step) stops every call to the shards, so
        that a shard's checkpoint then holds everything (a planned shard move)."""
        return True

    @classmethod
    def elastic_join(cls, cfg) -> str | None:
        """What a worker joining an elastic run starts from (JOIN_AS_IS, JOIN_FROM_REPLICA,
        JOIN_REPLICA_GROUP, JOIN_REGROUP), or None where the mode cannot change its number of
        workers during a run at ``cfg``'s settings (default: a process group that only
        JOIN_REGROUP forms again; Shadow says for its own group)."""
        if cls.needs_group(cfg) and cls.joins != JOIN_REGROUP:
            return None
        return cls.joins


    @classmethod
    @abstractmethod
    def make_rule(cls, cfg, shard: int, dense_init: np.ndarray | None) -> ShardRule:
        """Shard ``shard``'s rule; ``dense_init`` (shard 0 only) is the initial dense vector."""

    @classmethod
    def holds_dense(cls, cfg, shard: int) -> bool:
        """Whether shard ``shard``'s core holds the dense parameters with an optimizer."""
        return cls.dense_on_ps and shard == 0

    @classmethod
    def samples_per_update(cls, cfg) -> int:
        """Samples whose gradients one shard update applies (for the portion of lost
        samples, PLS)."""
        return cfg.train.batch_size

    @classmethod
    def caveat(cls, cfg) -> str | None:
        """A measured shortfall of the mode at ``cfg``'s settings, which the run says at
        start-up (and the mode's summary section holds): None where none is known."""
        return None

    @classmethod
    def console_line(cls, section: dict) -> str | None:
        """What the end of ``recsync train`` prints of the mode's summary section."""
        return None

    @classmethod
    def summary(cls, cfg, workers: list[dict] | None, shards: list[dict],
                waits: dict) -> dict | None:
        """The mode's section of summary.json (under ``summary_key``) from each worker's
        ``WorkerMode.stats()``, the shards' stats and the summed step-time split
        (``reports_waits``)."""
        return None
