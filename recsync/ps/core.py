"""ShardCore: the logic of one parameter-server shard, plain Python (the Ray actor wraps it).

A shard owns the embedding rows ``id % num_shards == shard`` of every table (an EmbeddingStore)
and, where the mode keeps them on the PS, the model's dense parameters as one flat vector with a
server-side torch optimizer. ``version`` counts the updates the shard has applied. What a push
does (applied at once, held until a step is complete, aggregated into a global batch) is the
mode's: the core hands every push to its ``ShardRule`` (modes/base.py), which calls back
``apply_now`` or ``apply_mean``. The core keeps nothing mode-specific.
"""

from __future__ import annotations

import copy

import functools
from collections import Counter

import numpy as np
import torch

from recsync.embedding.rows_copy import RowsCopy
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore
from recsync.model.optim import dense_step, make_dense_optimizer
from recsync.ps.aggregation import GradientBuffer, as_tensor


class DenseState:
    """Dense parameters as one flat float32 vector, updated by a torch optimizer (with
    ``warmup_steps`` updates of linear learning-rate warm-up, model/optim.py)."""

    def __init__(self, initial: torch.Tensor, optimizer: str, lr: float,
                 weight_decay: float = 0.0, warmup_steps: int = 0):
        self.params = initial.detach().clone().requires_grad_(True)
        self.optimizer = make_dense_optimizer(optimizer, [self.params], lr, weight_decay)
        self.warmup_steps = warmup_steps

    def apply(self, grad: torch.Tensor, lr_scale: float = 1.0) -> None:
        self.params.grad = grad
        dense_step(self.optimizer, self.warmup_steps, lr_scale)


class ShardCore:
    """One shard's rows, optional dense parameters, version, and push statistics."""

    def __init__(self, tables: list[TableSpec], row_optimizer, *, shard: int, num_shards: int,
                 rule, mode: str, seed: int = 0, init_scale: float = 0.05,
                 dense: DenseState | None = None, priority=None, full_every: int = 1,
                 make_rule=None):
        """``rule``: the ShardRule of ``mode``; ``make_rule(name)`` builds another mode's (for
        switching). ``priority`` (checkpoint/priority.py): which rows a partial checkpoint
        saves; every ``full_every``-th checkpoint (the first included) is a full one."""
        self.store = EmbeddingStore(tables, row_optimizer, seed=seed, init_scale=init_scale,
                                    shard=shard, num_shards=num_shards)
        self.dense = dense
        self.mode, self.rule = mode, rule
        self._rules = {mode: rule}  # every rule used: their counters survive a switch
        self._make_rule = make_rule
        self.version = 0
        self.staleness: Counter = Counter()  # staleness -> applied gradients (bounded)
        self.pulls = self.pushes = 0
        self.samples_applied = 0  # updates of aggregated gradients: their samples
        self.priority, self.full_every = priority, full_every
        self.snapshots = 0  # since this process started

    def pull(self, ids: list[np.ndarray], read_only: bool = False, dense: str = "vector",
             out=None) -> tuple[list[np.ndarray], object, int]:
        """Rows of each table's ``ids`` (int64, owned here), the dense part if held, version.
        ``read_only``: an evaluation's pull: a dynamic table admits, evicts and scores nothing
        (EmbeddingStore.pull's ``admit``). ``dense``: "vector" (the dense vector), "none"
        (left out), "with_state" ((vector, a copy of its optimizer's state_dict): eager applies
        its own update to them, modes/eager.py). ``out``: where the rows may be gathered
        (EmbeddingStore.pull_arrays)."""
        self.pulls += 1
        rows = self.store.pull_arrays(ids, admit=not read_only, out=out)
        part = None if dense == "none" else self.dense_vector()
        if dense == "with_state" and part is not None:
            part = (part, copy.deepcopy(self.dense.optimizer.state_dict()))
        return rows, part, self.version

    def dense_vector(self) -> np.ndarray | None:
        """A copy of the dense parameters, if this shard holds them."""
        return self.dense.params.detach().numpy().copy() if self.dense is not None else None

    def push(self, ids: list[np.ndarray], grads: list[np.ndarray], dense_grad: np.ndarray | None,
             meta: dict):
        """One worker's push, handed to the mode's rule; returns what the rule returns, or with
        ``meta["read_dense"]`` (eager) (that, the dense vector after the rule ran, version): the
        worker's next step reads its own update.
        ``meta["sampled"]`` (SSU): per table, which ids a sampled training sample touched."""
        if dense_grad is not None and self.dense is None:
            raise ValueError("a dense gradient was pushed to a shard that holds no dense "
                             "parameters")
        self._note_access(ids, meta.get("sampled"))
        self.pushes += 1
        result = self.rule.push(self, ids, grads, dense_grad, meta)
        if meta.get("read_dense"):
            return result, self.dense_vector(), self.version
        return result

    # -- what rules call -------------------------------------------------------------------
    def apply_now(self, ids, grads, dense_grad, lr_scale: float = 1.0,
                  dense_lr_scale: float | None = None) -> None:
        """Apply one gradient as an update of its own, and move the version on; the dense part
        at ``dense_lr_scale`` where given (eager: its dense vector was read later than its
        rows), else at ``lr_scale``."""
        self._apply(ids, grads, dense_grad, lr_scale, dense_lr_scale)
        self.version += 1

    def apply_mean(self, buffer: GradientBuffer) -> None:
        """Apply ``buffer``'s sample-weighted mean as one update, and move the version on."""
        self.samples_applied += buffer.samples
        mean = buffer.mean()
        if mean is not None:
            self._apply(*mean, 1.0)
        self.version += 1

    # -- the mode's verbs between runs of pushes (the driver's, while workers are paused) ---
    def use_mode(self, mode: str) -> None:
        """From now on, pushes go to ``mode``'s rule (switching; the driver has ended the
        previous rule first)."""
        if mode not in self._rules:
            self._rules[mode] = self._make_rule(mode)
        self.mode, self.rule = mode, self._rules[mode]

    def advance_to(self, version: int) -> None:
        """Count updates on from ``version`` (every shard the same number: after a switch or a
        rebuilt group, shards may have made different numbers of updates). Nothing may be
        buffered."""
        if self.rule.buffered():
            raise ValueError("advance_to with gradients still buffered; end the rule first")
        if version < self.version:
            raise ValueError(f"advance_to: the shard is at version {self.version}, past step "
                             f"{version}")
        self.version = version

    def install_dense(self, params: np.ndarray, optimizer: str, lr: float,
                      optimizer_state: dict, weight_decay: float = 0.0,
                      warmup_steps: int = 0) -> None:
        """Hold the dense parameters (flat) and their optimizer's state_dict (over the flat
        vector, see modes/handover.py; its update count goes on with the warm-up) from now
        on."""
        self.dense = DenseState(as_tensor(params), optimizer, lr, weight_decay, warmup_steps)
        self.dense.optimizer.load_state_dict(optimizer_state)

    def take_dense(self) -> dict:
        """Hand over the dense parameters and optimizer state, and stop holding them."""
        if self.dense is None:
            raise ValueError("this shard holds no dense parameters to hand over")
        out = {"params": self.dense.params.detach().numpy().copy(),
               "optimizer": self.dense.optimizer.state_dict()}
        self.dense = None
        return out

    @property
    def priority(self):
        return self._priority

    @priority.setter
    def priority(self, priority) -> None:
        """A checkpoint priority (CPR) counts a dynamic table's rows by slot: the tables log
        the ids they remove (tombstones of partial checkpoints) and have the priority forget
        a slot before another id gets it."""
        self._priority = priority
        if priority is not None:
            for t, table in self.store.dynamic.items():
                table.track_removals()
                table.on_remove = functools.partial(self._forget, t)

    def _forget(self, table: int, slots: torch.Tensor) -> None:
        if self._priority is not None:
            self._priority.forget(table, slots)

    def _note_access(self, ids: list[np.ndarray], sampled) -> None:
        """Tell the checkpoint priority (CPR) which rows a push touches (a dynamic table's:
        the slots of those ids that have one)."""
        if self.priority is None:
            return
        for t, i in enumerate(ids):
            if len(i):
                local = self.store.rows_of(t, as_tensor(i))
                mark = None if sampled is None else as_tensor(sampled[t])
                if t in self.store.dynamic:
                    has = local >= 0
                    local, mark = local[has], None if mark is None else mark[has]
                self.priority.record(t, local, mark)

    def _apply(self, ids, grads, dense_grad, lr_scale: float,
               dense_lr_scale: float | None = None) -> None:
        self.store.push_tables(ids, grads, lr_scale)
        if dense_grad is not None:
            self.dense.apply(as_tensor(dense_grad),
                             lr_scale if dense_lr_scale is None else dense_lr_scale)

    # -- checkpoints -----------------------------------------------------------------------
    def snapshot(self, partial: bool = False) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, meta) of everything this shard has applied: touched rows and their state,
        the dense parameters and their optimizer state, the rule's own state (EASGD's center,
        GBA's counters), the version and the counters. Copies: training may go on while they
        are written. Gradients a rule holds (an incomplete step, a GBA buffer) are not applied
        yet, so not included.
        ``partial``: only the rows the priority selects (meta["partial"] names it)."""
        copy, arrays, meta = self.begin_snapshot(partial, background=False)
        arrays.update(copy.run())
        self.end_snapshot(copy, meta)
        return arrays, meta

    def begin_snapshot(self, partial: bool = False, background: bool = True):
        """``snapshot`` as of now, but the rows are left to copy: (copy, arrays, meta), where
        ``copy.run()`` returns the rows' arrays (on another thread if ``background``: pushes
        may go on meanwhile, embedding/rows_copy.py; a partial snapshot's rows are chosen
        there too), after which ``end_snapshot``; the rest is copied here."""
        if partial and self.priority is None:
            raise ValueError("a partial snapshot needs a row priority (recovery.rows)")
        choose = self.priority.freeze() if partial else None
        if not partial and self.priority is not None:
            self.priority.reset()
        self.snapshots += 1
        copy = (self.store.begin_copy(choose=choose) if background
                else RowsCopy(self.store, choose=choose))
        arrays = {}
        meta = {"version": self.version, "pulls": self.pulls, "pushes": self.pushes,
                "samples_applied": self.samples_applied, "mode": self.mode,
                "staleness": {str(k): n for k, n in self.staleness.items()},
                "tables": len(self.store.tables),
                "shard": self.store.shard, "num_shards": self.store.num_shards,
                "dense_optimizer": None, "partial": self.priority.name if partial else None,
                "rows": None}
        if self.dense is not None:
            arrays["dense.params"] = self.dense.params.detach().numpy().copy()
            state = self.dense.optimizer.state_dict()
            for key, value in state["state"].get(0, {}).items():
                arrays[f"dense.opt.{key}"] = value.detach().numpy().copy()
            meta["dense_optimizer"] = {"class": type(self.dense.optimizer).__name__,
                                       "param_groups": state["param_groups"]}
        rule_arrays, meta["rule"] = self.rule.snapshot()
        arrays.update({f"rule.{k}": v for k, v in rule_arrays.items()})
        return copy, arrays, meta

    def end_snapshot(self, copy: RowsCopy, meta: dict) -> None:
        """After ``copy.run()``: the rows saved into ``meta``, and the priority forgets the
        rows a partial snapshot chose."""
        meta["rows"] = copy.rows
        if copy.chosen is not None:
            self.priority.restart(copy.chosen)

    def next_snapshot_partial(self) -> bool:
        """Whether the next checkpoint may be partial: a priority is set and it is not every
        ``full_every``-th (the first is always full)."""
        return self.priority is not None and self.snapshots % self.full_every != 0

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Go back to a full ``snapshot``: rows, dense state, the rule's state, version and
        counters."""
        self.restore_chain([(arrays, meta)])

    def restore_chain(self, chain: list[tuple[dict[str, np.ndarray], dict]]) -> None:
        """Go back to a full snapshot and the partial ones taken after it, in order: the rows
        each saved overwrite the earlier ones (a dynamic table's by id, and the ids a partial
        one tombstones are removed: EmbeddingStore.restore_chain); the rest (dense state,
        version, counters) is the last one's."""
        if chain[0][1].get("partial"):
            raise ValueError("a chain of snapshots starts with a full one")
        arrays, meta = chain[-1]
        if "rule" not in meta:
            raise ValueError("the snapshot was written by a recsync from before the modes' shard "
                             "rules (it holds no rule state); this version cannot restore it")
        layout = (meta.get("shard", self.store.shard),
                  meta.get("num_shards", self.store.num_shards))
        if layout != (self.store.shard, self.store.num_shards):
            raise ValueError(f"the snapshot is of shard {layout[0]} of {layout[1]}, this is shard "
                             f"{self.store.shard} of {self.store.num_shards} (a job checkpoint "
                             f"of other shards is resharded on --resume)")
        if meta["tables"] != len(self.store.tables):
            raise ValueError(f"the snapshot has {meta['tables']} tables, this shard "
                             f"{len(self.store.tables)}")
        if (meta["dense_optimizer"] is None) != (self.dense is None):
            raise ValueError("the snapshot and this shard disagree on holding the dense "
                             "parameters")
        self.store.restore_chain([a for a, _ in chain])
        if self.dense is not None:
            opt = meta["dense_optimizer"]
            if opt["class"] != type(self.dense.optimizer).__name__:
                raise ValueError(f"the snapshot's dense optimizer is {opt['class']}, this "
                                 f"shard's {type(self.dense.optimizer).__name__}")
            with torch.no_grad():
                self.dense.params.copy_(as_tensor(arrays["dense.params"]))
            state = {k.removeprefix("dense.opt."): as_tensor(v) for k, v in arrays.items()
                     if k.startswith("dense.opt.")}
            self.dense.optimizer.load_state_dict({"state": {0: state} if state else {},
                                                  "param_groups": opt["param_groups"]})
        if meta["mode"] != self.mode:
            self.use_mode(meta["mode"])
        self.rule.restore({k.removeprefix("rule."): v for k, v in arrays.items()
                           if k.startswith("rule.")}, meta["rule"])
        self.version, self.pulls, self.pushes = meta["version"], meta["pulls"], meta["pushes"]
        self.samples_applied = meta["samples_applied"]
        self.staleness = Counter({int(k): n for k, n in meta["staleness"].items()})
        if self.priority is not None:
            self.priority.reset()

    def trained_rows(self, with_state: bool = False) -> list:
        """The rows this shard's training touched, per table, keyed by global id (model_dir
        TrainedRows; ``with_state``: with their optimizer state). A copy."""
        from recsync.model_dir.state import store_rows
        return store_rows(self.store, with_state)

    def dense_optimizer_state(self) -> dict | None:
        """The dense optimizer's state_dict over the flat vector, if this shard holds it."""
        return None if self.dense is None else self.dense.optimizer.state_dict()

    def stats(self) -> dict:
        return {"version": self.version, "pulls": self.pulls, "pushes": self.pushes,
                "rows_touched": self.store.num_initialized(),
                "staleness": dict(self.staleness), "samples_applied": self.samples_applied,
                "mode": self.mode, "dynamic": self.store.dynamic_stats(),
                **{k: v for rule in self._rules.values() for k, v in rule.stats().items()}}

    def record_staleness(self, staleness: int, gradients: int = 1) -> None:
        self.staleness[staleness] += gradients
