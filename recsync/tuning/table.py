"""The table of trials of `recsync tune`, kept as the trials go (no Ray here: the search feeds
it, recsync/tuning/search.py) and written to OUT after each trial ends, so that what finished
stays there whatever stops the search.

Files: ``trials.json`` (every trial: its values, status, validation evaluations, eval-split
figures, time), ``trials.csv`` (one line a trial, the same but the evaluations) and
``tune.log`` (the progress lines the console shows, one per finished trial).

A trial's status: ``completed`` (its run trained to the end or stopped early by
train.patience; its summary.json has the eval-split figures), ``stopped`` (ASHA stopped it
at a rung: no eval-split figures), ``failed`` (its run failed; ``error`` says why),
``interrupted`` (running when the search was stopped), ``pending`` (never started).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

TABLE_JSON, TABLE_CSV, LOG = "trials.json", "trials.csv", "tune.log"
TRIALS_DIR = "trials"  # OUT/trials/TRIAL_ID: each trial's run directory


@dataclass
class TrialRow:
    """One trial as far as the search knows it."""

    trial: str
    values: dict
    status: str = "pending"
    evals: list = field(default_factory=list)  # {"samples", "logloss", "auc"} each
    eval_auc: float | None = None  # the run's final evaluation on the eval split
    eval_logloss: float | None = None
    stopped: str | None = None  # summary.json's stopped.reason
    error: str | None = None
    time_s: float | None = None
    started: float | None = None  # time.monotonic() when it started

    @property
    def best_logloss(self) -> float | None:
        """The lowest validation log loss it reported (None: no finite one)."""
        losses = [e["logloss"] for e in self.evals if math.isfinite(e["logloss"])]
        return min(losses) if losses else None

    def as_dict(self) -> dict:
        return {"trial": self.trial, "status": self.status, "values": self.values,
                "best_validation_logloss": self.best_logloss,
                "validation_evals": len(self.evals), "eval_auc": self.eval_auc,
                "eval_logloss": self.eval_logloss, "stopped": self.stopped,
                "error": self.error, "time_s": self.time_s,
                "samples": self.evals[-1]["samples"] if self.evals else 0,
                "evals": self.evals}


class TrialTable:
    """The trials of one search, written to ``out`` (see the module docstring). ``keys``: the
    searched config keys (the table's columns); ``echo``: where progress lines go besides
    tune.log (the console)."""

    def __init__(self, out: Path, keys: list[str], trials: int, echo=print):
        self.out, self.keys, self.trials, self.echo = Path(out), list(keys), trials, echo
        self.rows: dict[str, TrialRow] = {}
        self.finished = 0

    def row(self, trial: str, values: dict) -> TrialRow:
        if trial not in self.rows:
            self.rows[trial] = TrialRow(trial, {k: values.get(k) for k in self.keys})
        return self.rows[trial]

    def started(self, trial: str, values: dict) -> None:
        row = self.row(trial, values)
        row.status, row.started = "running", time.monotonic()

    def result(self, trial: str, values: dict, result: dict) -> None:
        """A validation evaluation the trial reported (recsync/tuning/trial.py's keys)."""
        row = self.row(trial, values)
        row.evals.append({"samples": result["samples"], "logloss": result["validation_logloss"],
                          "auc": result.get("validation_auc")})

    def ended(self, trial: str, values: dict, error: str | None = None) -> TrialRow:
        """The trial ended (``error``: it failed): its status from its run's summary.json,
        the files written again and its progress line said."""
        row = self.row(trial, values)
        if row.started is not None:
            row.time_s = time.monotonic() - row.started
        summary = read_summary(self.out / TRIALS_DIR / trial)
        if summary is not None:
            ev = summary.get("eval") or {}
            row.eval_auc, row.eval_logloss = ev.get("auc"), ev.get("logloss")
            row.stopped = (summary.get("stopped") or {}).get("reason")
        if error is not None:
            row.status = "failed"
            row.error = (summary or {}).get("cause") or error.strip().splitlines()[-1]
        elif summary is not None and summary.get("status") == "completed":
            row.status = "completed"
        elif summary is not None:  # the run itself said it did not complete
            row.status, row.error = "failed", summary.get("cause")
        else:
            row.status = "stopped"  # by the scheduler, inside a report (trial.py)
        self.finished += 1
        self.say(self.line(row))
        self.write()
        return row

    def interrupted(self) -> None:
        """The search was stopped: trials still running say so; the files written."""
        for row in self.rows.values():
            if row.status == "running":
                row.status = "interrupted"
                if row.started is not None:
                    row.time_s = time.monotonic() - row.started
        self.write()

    def best(self) -> TrialRow | None:
        """The trial with the lowest validation log loss (a completed one wins a tie); a
        failed trial only where none other reported (its config would fail again)."""
        rows = [r for r in self.rows.values() if r.best_logloss is not None]
        if not rows:
            return None
        return min(rows, key=lambda r: (r.status == "failed", r.best_logloss,
                                        r.status != "completed"))

    def line(self, row: TrialRow) -> str:
        """The progress line of a finished trial."""
        best = row.best_logloss
        parts = [f"trial {self.finished}/{self.trials} {row.trial} {row.status}",
                 f"best validation logloss {_num(best, '.5f')} over {len(row.evals)} evals"]
        if row.eval_auc is not None or row.eval_logloss is not None:
            parts.append(f"eval AUC {_num(row.eval_auc, '.4f')} logloss "
                         f"{_num(row.eval_logloss, '.4f')}")
        if row.time_s is not None:
            parts.append(f"{row.time_s:.1f} s")
        if row.error:
            parts.append(f"error: {row.error}")
        values = " ".join(f"{k}={_value(v)}" for k, v in row.values.items())
        return ", ".join(parts) + f"; {values}"

    def say(self, line: str) -> None:
        self.echo(line)
        with open(self.out / LOG, "a") as f:
            f.write(line + "\n")

    def write(self) -> None:
        """trials.json and trials.csv, each replaced atomically."""
        rows = sorted(self.rows.values(), key=lambda r: r.trial)
        _atomic(self.out / TABLE_JSON,
                json.dumps({"keys": self.keys, "trials": [r.as_dict() for r in rows]},
                           indent=2, default=str) + "\n")
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["trial", "status", *self.keys, "best_validation_logloss",
                         "validation_evals", "samples", "eval_auc", "eval_logloss", "time_s",
                         "error"])
        for r in rows:
            d = r.as_dict()
            writer.writerow([r.trial, r.status, *(r.values.get(k) for k in self.keys),
                             d["best_validation_logloss"], d["validation_evals"], d["samples"],
                             r.eval_auc, r.eval_logloss,
                             None if r.time_s is None else round(r.time_s, 2), r.error or ""])
        _atomic(self.out / TABLE_CSV, buf.getvalue())

    def text(self) -> str:
        """The table to print: one line a trial, the best validation log loss first."""
        rows = sorted(self.rows.values(),
                      key=lambda r: (r.best_logloss is None, r.best_logloss or 0.0, r.trial))
        head = ["trial", "status", *self.keys, "val logloss", "evals", "eval AUC",
                "eval logloss", "time s"]
        body = [[r.trial, r.status, *(_value(r.values.get(k)) for k in self.keys),
                 _num(r.best_logloss, ".5f"), str(len(r.evals)), _num(r.eval_auc, ".4f"),
                 _num(r.eval_logloss, ".4f"), _num(r.time_s, ".1f")] for r in rows]
        widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
                         for line in [head, *body])


def read_summary(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _value(v) -> str:
    return format(v, ".4g") if isinstance(v, float) else str(v)


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
