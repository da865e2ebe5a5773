"""Model selection on the validation slice (``train.validation``) and early stopping
(``train.patience``), for every mode: which evaluation was the best (lowest validation log
loss), whether the run should stop, and why a run stopped (summary.json's ``stopped``).

A local run also keeps the best model itself (``BestLocal``): a copy, in memory, of the dense
parameters and their optimizer state and of the embedding rows training touched (the store's
snapshot, as a checkpoint takes it), taken at each evaluation that improves on the best and put
back at the end. Memory rather than disk: a copy costs one memcpy of the touched rows, less
than the evaluation that asked for it, and writing OUT/model at each improvement would write
files that the next improvement replaces; at most one copy is held."""

from __future__ import annotations

import copy
import math
import sys

EARLY_STOPPING = "early_stopping"  # train.patience evaluations without improvement
EPOCHS = "epochs"  # every epoch trained
MAX_STEPS = "max_steps"  # train.max_steps reached
BEST_KEYS = ("samples", "time_s", "logloss", "auc", "ne", "calibration", "rows")


class Selection:
    """The evaluations of one run on the validation slice, as they come (``observe``)."""

    def __init__(self, patience: int, enabled: bool = True, on_eval=None):
        self.enabled, self.patience = enabled, patience
        self.best: dict | None = None  # the best evaluation's record, with its "index"
        self.since_best = 0  # evaluations since the best one
        self.count = 0
        self.on_eval = on_eval  # run()'s hook (run/driver.py): told of each evaluation

    def observe(self, result: dict, index: int) -> bool:
        """Evaluation ``index`` (of record.evals) ended with ``result``; True where it is the
        new best (lower log loss than every one before; a NaN never is). The hook
        ``on_eval``, if any, is called with a copy of ``result`` first (what it raises ends
        the run as an error of the run would)."""
        if not self.enabled:
            return False
        if self.on_eval is not None:
            self.on_eval(dict(result))
        self.count += 1
        loss = result.get("logloss")
        if loss is not None and not math.isnan(loss) and (
                self.best is None or loss < self.best["logloss"]):
            self.best = {"index": index, **{k: result.get(k) for k in BEST_KEYS}}
            self.since_best = 0
            return True
        self.since_best += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.enabled and self.patience > 0 and self.since_best >= self.patience

    def stop_line(self) -> str:
        b = self.best
        best = ("no evaluation had a finite log loss" if b is None else
                f"the best was evals[{b['index']}] at {b['samples']:,} samples "
                f"(validation log loss {b['logloss']:.5f})")
        n = self.since_best
        return (f"early stopping: {n} evaluation{'s' if n != 1 else ''} without a lower "
                f"validation log loss (train.patience = {self.patience}); {best}")

    def kept_line(self) -> str:
        b = self.best
        return (f"the model kept is evals[{b['index']}]'s (validation log loss "
                f"{b['logloss']:.5f} at {b['samples']:,} samples)")

    def section(self, reason: str | None) -> dict:
        """summary.json's ``stopped``: why training ended and, with a validation slice, its
        best evaluation (the model the run kept)."""
        return {"reason": reason, "patience": self.patience if self.enabled else None,
                "validation_evals": self.count if self.enabled else None,
                "best_eval": self.best}


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class BestLocal:
    """The local run's best model so far (local_run.LocalModel), in memory."""

    def __init__(self):
        self.saved: tuple | None = None
        self.current = True  # the model now is the saved one (nothing trained since)

    def save(self, model) -> None:
        self.saved = ({k: v.detach().clone() for k, v in model.dense.state_dict().items()},
                      copy.deepcopy(model.dense_optimizer.state_dict()),
                      model.lookup.store.snapshot(checkpoint=False))
        self.current = True

    def trained(self) -> None:
        """A step since the last save."""
        self.current = False

    def restore(self, model) -> bool:
        """Put the saved model back (True), unless there is none or it is the model now."""
        if self.saved is None or self.current:
            return False
        dense, optimizer, rows = self.saved
        model.dense.load_state_dict(dense)
        model.dense_optimizer.load_state_dict(optimizer)
        model.lookup.store.restore(rows)
        self.current = True
        return True
