"""ShardCore: the logic of one parameter-server shard, plain Python (the Ray actor wraps it).

A shard owns the embedding rows ``id % num_shards == shard`` of every table (an EmbeddingStore)
and, in PS modes, may own the model's dense parameters as one flat vector with a server-side
torch optimizer. ``version`` counts the updates the shard has applied:

- async: every push is applied at once and bumps the version; its staleness is the version at
  apply time minus the version the worker read when it pulled.
- sync: the pushes of one step are summed (each worker pushes gradient x its sample count) and
  applied once all ``num_workers`` have arrived, divided by the total samples: the gradient of
  the mean loss over the global batch, whatever the split of samples between workers. The
  version then equals the number of completed steps.
- gba: pushes carry the version the worker read (its token) and go into one buffer, whatever
  step they belong to; when it holds ``gba_gradients`` of them their sample-weighted mean is
  applied (the global batch of sync) and the version moves on. Gradients staler than the
  threshold are decayed or dropped (aggregation.py).
- shadow/foreground with EASGD: shard 0 holds the center copy of the dense parameters, which
  the trainers' elastic moves ``d`` pull towards them (``easgd_push``: center += d).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from recsync.embedding.sharding import local_index
from recsync.embedding.spec import TableSpec
from recsync.embedding.store import EmbeddingStore
from recsync.ps.aggregation import GradientBuffer, StalenessDecay, as_tensor
from recsync.sync.shadow_rules import easgd_delta


class DenseState:
    """Dense parameters as one flat float32 vector, updated by a torch optimizer."""

    def __init__(self, initial: torch.Tensor, optimizer: str, lr: float):
        from recsync.model.optim import DENSE_OPTIMIZERS
        self.params = initial.detach().clone().requires_grad_(True)
        self.optimizer = DENSE_OPTIMIZERS[optimizer]([self.params], lr=lr)

    def apply(self, grad: torch.Tensor, lr_scale: float = 1.0) -> None:
        self.params.grad = grad
        if lr_scale != 1.0:
            for g in self.optimizer.param_groups:
                g.setdefault("base_lr", g["lr"])
                g["lr"] = g["base_lr"] * lr_scale
        self.optimizer.step()
        for g in self.optimizer.param_groups:
            if "base_lr" in g:
                g["lr"] = g["base_lr"]


class ShardCore:
    """One shard's rows, optional dense parameters, version, and push statistics."""

    def __init__(self, tables: list[TableSpec], row_optimizer, *, shard: int, num_shards: int,
                 num_workers: int, seed: int = 0, init_scale: float = 0.05,
                 dense: DenseState | None = None, gba_gradients: int = 0,
                 decay: StalenessDecay = StalenessDecay(0, "none"),
                 center: torch.Tensor | None = None, priority=None, full_every: int = 1):
        """``gba_gradients``: gradients per GBA update (M; 0: ``num_workers``); ``decay``: how
        GBA weighs stale gradients; ``center``: EASGD's center copy (flat), if this shard
        holds it. ``priority`` (checkpoint/priority.py): which rows a partial checkpoint
        saves; every ``full_every``-th checkpoint (the first included) is a full one."""
        self.store = EmbeddingStore(tables, row_optimizer, seed=seed, init_scale=init_scale,
                                    shard=shard, num_shards=num_shards)
        self.dense, self.num_workers = dense, num_workers
        self.version = 0
        self.staleness: Counter = Counter()  # staleness -> applied pushes (bounded)
        self.pulls = self.pushes = 0
        self._pending: dict[int, GradientBuffer] = {}  # sync step -> its contributions
        self.gba_gradients, self.decay = gba_gradients or num_workers, decay
        self._gba = GradientBuffer(len(tables))
        self.gba_counts = {"applied": 0, "decayed": 0, "dropped": 0, "updates": 0}
        self.samples_applied = 0  # sync and gba: samples whose gradients went into an update
        self.center = None if center is None else center.detach().clone()
        self.easgd_pushes = 0
        self.priority, self.full_every = priority, full_every
        self.snapshots = 0  # since this process started

    def pull(self, ids: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray | None, int]:
        """Rows of each table's ``ids`` (int64, owned here), the dense vector if held, version."""
        self.pulls += 1
        rows = [self.store.pull(t, as_tensor(i)).numpy() for t, i in enumerate(ids)]
        dense = self.dense.params.detach().numpy().copy() if self.dense is not None else None
        return rows, dense, self.version

    def push(self, ids: list[np.ndarray], grads: list[np.ndarray], dense_grad: np.ndarray | None,
             version_read: int, lr_scale: float = 1.0, sampled=None) -> int:
        """Apply one worker's gradients now (async); return the staleness of this update.
        ``sampled`` (SSU): per table, which ids a sampled training sample touched."""
        self._check_dense(dense_grad)
        self._note_access(ids, sampled)
        # (after a partial recovery the shard may be behind the version a worker read: 0)
        staleness = max(0, self.version - version_read)
        self._apply(ids, grads, dense_grad, lr_scale)
        self.staleness[staleness] += 1
        self.pushes += 1
        self.version += 1
        return staleness

    def push_sync(self, step: int, ids: list[np.ndarray], grads: list[np.ndarray],
                  dense_grad: np.ndarray | None, samples: int, sampled=None) -> bool:
        """Add one worker's contribution to ``step`` (grads already x ``samples``).

        Applies the step when all workers have pushed it; returns whether it was applied.
        """
        if step != self.version:
            raise ValueError(f"sync push for step {step}, but the shard is at step {self.version}")
        self._check_dense(dense_grad)  # before queueing: a bad push must not poison the step
        self._note_access(ids, sampled)
        pending = self._pending.setdefault(step, GradientBuffer(len(self.store.tables)))
        pending.add(ids, grads, dense_grad, samples)
        self.pushes += 1
        if len(pending) < self.num_workers:
            return False
        del self._pending[step]
        self.staleness[0] += len(pending)  # sync: every gradient applied to the version it read
        self._apply_mean(pending)
        return True

    def push_gba(self, ids: list[np.ndarray], grads: list[np.ndarray],
                 dense_grad: np.ndarray | None, token: int, samples: int, sampled=None) -> int:
        """GBA: add one worker's gradient (grads already x ``samples``) computed on version
        ``token``; apply the buffer once it holds ``gba_gradients``. Returns the staleness.

        A token that never comes back (its worker died) stalls nothing: the buffer fills with
        whichever gradients arrive.
        """
        self._check_dense(dense_grad)
        self._note_access(ids, sampled)
        staleness = max(0, self.version - token)  # (0 if the shard was rolled back since)
        weight = self.decay.weight(staleness)
        self.pushes += 1
        if weight == 0.0:
            self.gba_counts["dropped"] += 1
            return staleness
        self.gba_counts["applied"] += 1
        self.gba_counts["decayed"] += weight < 1.0
        self.staleness[staleness] += 1
        self._gba.add(ids, grads, dense_grad, samples, weight)
        if len(self._gba) >= self.gba_gradients:
            self._apply_mean(self._gba)
            self.gba_counts["updates"] += 1
        return staleness

    def flush_gba(self) -> int:
        """Apply what the GBA buffer holds, if anything (the end of a run: no gradient is left
        unapplied). Returns how many gradients that was."""
        held = len(self._gba)
        if held:
            self._apply_mean(self._gba)
            self.gba_counts["updates"] += 1
        return held

    def _apply_mean(self, buffer: GradientBuffer) -> None:
        """Apply ``buffer``'s sample-weighted mean as one update, and move the version on."""
        self.samples_applied += buffer.samples
        mean = buffer.mean()
        if mean is not None:
            self._apply(*mean, 1.0)
        self.version += 1

    # -- EASGD's center copy (modes shadow and foreground) -----------------------------------
    def easgd_center(self) -> np.ndarray:
        if self.center is None:
            raise ValueError("this shard holds no EASGD center copy")
        return self.center.numpy().copy()

    def easgd_push(self, d: np.ndarray) -> None:
        """A trainer moved by -d towards the center: the center moves by +d."""
        if self.center is None:
            raise ValueError("this shard holds no EASGD center copy")
        if d.shape != self.center.shape:
            raise ValueError(f"EASGD move of shape {d.shape}, the center has "
                             f"{tuple(self.center.shape)}")
        self.center.add_(as_tensor(d))
        self.easgd_pushes += 1

    def easgd_exchange(self, replica: np.ndarray, alpha: float) -> np.ndarray:
        """One EASGD round in one call: d = alpha (w - c) from a trainer's replica w; the
        center moves by +d here, and the trainer moves by -d with the d returned."""
        d = easgd_delta(as_tensor(replica), torch.from_numpy(self.easgd_center()), alpha)
        self.easgd_push(d.numpy())
        return d.numpy()

    # -- switching between sync and gba (the driver pauses every worker first) ---------------
    def install_dense(self, params: np.ndarray, optimizer: str, lr: float,
                      optimizer_state: dict) -> None:
        """To gba: hold the dense parameters (flat) and their optimizer's state_dict (over the
        flat vector, see sync/handover.py) from now on."""
        self.dense = DenseState(as_tensor(params), optimizer, lr)
        self.dense.optimizer.load_state_dict(optimizer_state)

    def take_dense(self) -> dict:
        """To sync: hand over the dense parameters and optimizer state, and stop holding them."""
        if self.dense is None:
            raise ValueError("this shard holds no dense parameters to hand over")
        out = {"params": self.dense.params.detach().numpy().copy(),
               "optimizer": self.dense.optimizer.state_dict()}
        self.dense = None
        return out

    def begin_sync(self, step: int) -> None:
        """To sync at global step ``step``: every shard's sync steps count on from the same
        number (after gba, shards may have made different numbers of updates). The GBA buffer
        must have been flushed."""
        if len(self._gba) or self._pending:
            raise ValueError("begin_sync with gradients still buffered; flush_gba first")
        if step < self.version:
            raise ValueError(f"begin_sync at step {step}, but the shard is at {self.version}")
        self.version = step

    def drop_pending(self) -> int:
        """Forget the contributions to a sync step that will never complete (a worker died
        before pushing it; the group is rebuilt and redoes the step). Returns how many."""
        dropped = sum(len(p) for p in self._pending.values())
        self._pending.clear()
        return dropped

    def _check_dense(self, dense_grad) -> None:
        if dense_grad is not None and self.dense is None:
            raise ValueError("a dense gradient was pushed to a shard that holds no dense "
                             "parameters")

    def _note_access(self, ids: list[np.ndarray], sampled) -> None:
        """Tell the checkpoint priority (CPR) which rows a push touches."""
        if self.priority is None:
            return
        for t, i in enumerate(ids):
            if len(i):
                self.priority.record(t, local_index(as_tensor(i), self.store.num_shards),
                                     None if sampled is None else as_tensor(sampled[t]))

    def _apply(self, ids, grads, dense_grad, lr_scale: float) -> None:
        for t, (i, g) in enumerate(zip(ids, grads)):
            if len(i):
                self.store.push(t, as_tensor(i), as_tensor(g), lr_scale)
        if dense_grad is not None:
            self.dense.apply(as_tensor(dense_grad), lr_scale)

    # -- checkpoints -----------------------------------------------------------------------
    def snapshot(self, partial: bool = False) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, meta) of everything this shard has applied: touched rows and their state,
        the dense parameters and their optimizer state, EASGD's center, the version and the
        counters. Copies: training may go on while they are written. Gradients waiting in a
        GBA buffer or an incomplete sync step are not applied yet, so not included.
        ``partial``: only the rows the priority selects (meta["partial"] names it)."""
        if partial and self.priority is None:
            raise ValueError("a partial snapshot needs a row priority (recovery.rows)")
        rows = self.priority.select() if partial else None
        if not partial and self.priority is not None:
            self.priority.reset()
        self.snapshots += 1
        arrays = self.store.snapshot(rows)
        meta = {"version": self.version, "pulls": self.pulls, "pushes": self.pushes,
                "samples_applied": self.samples_applied, "gba_counts": dict(self.gba_counts),
                "staleness": {str(k): n for k, n in self.staleness.items()},
                "easgd_pushes": self.easgd_pushes, "tables": len(self.store.tables),
                "dense_optimizer": None, "partial": self.priority.name if partial else None,
                "rows": int(sum(len(a) for k, a in arrays.items() if k.endswith(".local")))}
        if self.dense is not None:
            arrays["dense.params"] = self.dense.params.detach().numpy().copy()
            state = self.dense.optimizer.state_dict()
            for key, value in state["state"].get(0, {}).items():
                arrays[f"dense.opt.{key}"] = value.detach().numpy().copy()
            meta["dense_optimizer"] = {"class": type(self.dense.optimizer).__name__,
                                       "param_groups": state["param_groups"]}
        if self.center is not None:
            arrays["center"] = self.center.numpy().copy()
        return arrays, meta

    def next_snapshot_partial(self) -> bool:
        """Whether the next checkpoint may be partial: a priority is set and it is not every
        ``full_every``-th (the first is always full)."""
        return self.priority is not None and self.snapshots % self.full_every != 0

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Go back to a full ``snapshot``: rows, dense state, center, version and counters."""
        self.restore_chain([(arrays, meta)])

    def restore_chain(self, chain: list[tuple[dict[str, np.ndarray], dict]]) -> None:
        """Go back to a full snapshot and the partial ones taken after it, in order: the rows
        each saved overwrite the earlier ones; the rest (dense state, version, counters) is
        the last one's."""
        if chain[0][1].get("partial"):
            raise ValueError("a chain of snapshots starts with a full one")
        arrays, meta = chain[-1]
        if meta["tables"] != len(self.store.tables):
            raise ValueError(f"the snapshot has {meta['tables']} tables, this shard "
                             f"{len(self.store.tables)}")
        if (meta["dense_optimizer"] is None) != (self.dense is None):
            raise ValueError("the snapshot and this shard disagree on holding the dense "
                             "parameters")
        for k, (a, _) in enumerate(chain):
            self.store.restore(a, on_top=k > 0)
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
        if "center" in arrays:
            self.center = as_tensor(arrays["center"]).clone()
        self.version, self.pulls, self.pushes = meta["version"], meta["pulls"], meta["pushes"]
        self.samples_applied = meta["samples_applied"]
        self.gba_counts = dict(meta["gba_counts"])
        self.staleness = Counter({int(k): n for k, n in meta["staleness"].items()})
        self.easgd_pushes = meta["easgd_pushes"]
        self._gba = GradientBuffer(len(self.store.tables))
        self._pending.clear()
        if self.priority is not None:
            self.priority.reset()

    def stats(self) -> dict:
        return {"version": self.version, "pulls": self.pulls, "pushes": self.pushes,
                "rows_touched": self.store.num_initialized(),
                "staleness": dict(self.staleness), "gba": dict(self.gba_counts),
                "samples_applied": self.samples_applied, "easgd_pushes": self.easgd_pushes}
