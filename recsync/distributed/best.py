"""Model selection and early stopping in a distributed run (run/selection.py has the rules).

With a validation slice (train.validation) each periodic evaluation (distributed/evals.py)
gathers the trained rows from the shards with the dense parameters it copies and scores that
copy, so that the evaluation and the model it keeps are one and the same (the workers train on
while it is gathered: the shards are read one after the other). The driver keeps the best
copy in memory; at the end the trained model is scored on the validation slice too, and where
an earlier evaluation was better, OUT/model and the final evaluation on the eval split are that
evaluation's model. ``train.patience`` evaluations without improvement drain the work queue:
the workers finish the chunks they hold and the run ends as it would after its last epoch."""

from __future__ import annotations

import copy
import time

import ray

from recsync.data.holdout import VALIDATION
from recsync.metrics.evaluate import evaluate
from recsync.model_dir.state import ModelState
from recsync.model_dir.trained import RowsLookup
from recsync.run.selection import EARLY_STOPPING, EPOCHS, MAX_STEPS, Selection, say


class BestKept:
    """The best evaluation's model of one run (handle.DistributedRun) and the stop decision."""

    def __init__(self, run, on_eval=None):
        self.run = run
        self.selection = Selection(run.cfg.train.patience, bool(run.ds.held), on_eval)
        self.state: ModelState | None = None  # the best evaluation's (None: the final one's)
        self.stopping = False

    @property
    def enabled(self) -> bool:
        return self.selection.enabled

    def observe(self, result: dict, kept: ModelState | None, training: bool = True) -> None:
        """A periodic evaluation ended (its record is the last of record.evals); ``kept``: the
        model it scored. ``training`` False: training had ended before it did, so there is
        nothing left to stop (the run ended by its epochs or steps)."""
        record = self.run.record
        if self.selection.observe(result, len(record.evals) - 1):
            self.state = kept
        if training and self.selection.should_stop and not self.stopping:
            self.stopping = True
            line = self.selection.stop_line()
            say(line)
            record.event(time.time() - self.run.tallies.start_unix, line)
            self.drain()

    def drain(self) -> None:
        """After early stopping: no chunk is handed out any more (again after a recovery that
        restored the queue)."""
        if self.stopping:
            ray.get(self.run.actors.queue.drain.remote())

    def reason(self) -> str:
        t, record = self.run.cfg.train, self.run.record
        if self.stopping:
            return EARLY_STOPPING
        return MAX_STEPS if t.max_steps and record.steps >= t.max_steps else EPOCHS

    def at_end(self, trained) -> ModelState | None:
        """The trained model (local_run.LocalModel: the driver's dense module, rows served by
        the shards) scored on the validation slice, unless the last evaluation saw it all;
        returns the best earlier evaluation's model, or None where the trained one is the
        best (or there is no validation slice)."""
        if not self.enabled:
            return None
        record, t = self.run.record, self.run.cfg.train
        if record.samples > (record.evals[-1]["samples"] if record.evals else 0):
            start = time.perf_counter()
            result = evaluate(trained.dense, trained.lookup, self.run.ds, t.eval_sample_rows,
                              t.eval_batch_size, split=VALIDATION)
            result.update(samples=record.samples, time_s=record.time_s(),
                          eval_s=time.perf_counter() - start, split=VALIDATION)
            record.evals.append(result)
            record.eval_total_s += result["eval_s"]
            self.observe(result, None, training=False)
        if self.selection.best is None or self.selection.best["index"] == len(record.evals) - 1:
            return None
        return self.state

    def best_model(self, state: ModelState, dense_model):
        """A LocalModel of ``state`` for the final evaluation (a copy of the dense module)."""
        from recsync.run.local_run import LocalModel
        dense = copy.deepcopy(dense_model)
        dense.load_state_dict(state.dense_state)
        cfg = self.run.cfg
        lookup = RowsLookup(self.run.model.plan, state.tables, state.trained, cfg.train.seed,
                            cfg.model.embedding_init_scale)
        return LocalModel(dense, lookup, None)
