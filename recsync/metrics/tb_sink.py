"""TensorBoard event files in OUT/tb/ (``output.tensorboard = true``), written from exactly the
records metrics.jsonl gets (MetricsLog passes each one on). Their step is the number of training
samples, as metrics.jsonl's ``samples``; an evaluation's scalars are at the samples it
evaluated after.

Scalars: ``train/loss``, ``train/samples_per_s``, ``train/staleness_mean`` and
``train/staleness_max`` (PS modes), ``train/mode`` (the mode's index in ``MODE_NAMES``);
``eval/auc``, ``eval/logloss``, ``eval/ne``, ``eval/calibration`` (evaluations during training)
and ``final/...`` (the final evaluation); ``events/checkpoints`` and ``events/recoveries``
(how many so far). Text: ``mode`` (each mode period's start) and ``events`` (every event:
checkpoints, recoveries, kills, switches, skipped evaluations).

tensorboard is an optional extra (``pip install 'recsync[tensorboard]'``); preflight refuses a
run that asks for it where it is absent (``require_tensorboard``)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from recsync.modes import LOCAL, MODES

MODE_NAMES = [LOCAL, *MODES]  # train/mode is the index of the mode in this list
EVAL_KEYS = ("auc", "logloss", "ne", "calibration")
INSTALL = "pip install 'recsync[tensorboard]'"


def require_tensorboard() -> None:
    """ValueError (one line) where ``output.tensorboard = true`` cannot be honoured."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ValueError(f"output.tensorboard = true needs the tensorboard package, which is "
                         f"not installed: {INSTALL} (or set output.tensorboard = false)")


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(log_dir), flush_secs=10)
        self.mode: str | None = None
        self.counts = {"checkpoints": 0, "recoveries": 0}

    def write(self, record: dict) -> None:
        """One metrics.jsonl record."""
        step = int(record.get("samples") or 0)
        for key in ("loss", "samples_per_s"):
            self._scalar(f"train/{key}", record.get(key), step)
        staleness = record.get("staleness") or {}
        for key in ("mean", "max"):
            self._scalar(f"train/staleness_{key}", staleness.get(key), step)
        mode = record.get("mode")
        if mode is not None:
            if mode != self.mode:
                self.writer.add_text("mode", f"{mode} from {step:,} samples "
                                     f"({_seconds(record.get('time_s'))} of training)", step)
                self.mode = mode
            if mode in MODE_NAMES:
                self._scalar("train/mode", MODE_NAMES.index(mode), step)
        for e in record.get("events") or []:
            text = str(e.get("event", ""))
            self.writer.add_text("events", f"{_seconds(e.get('time_s'))}: {text}", step)
            kind = _kind(text)
            if kind is not None:
                self.counts[kind] += 1
                self._scalar(f"events/{kind}", self.counts[kind], step)
        ev = record.get("eval")
        if ev:
            self.write_eval("eval", ev, int(ev.get("samples", step)))
        self.writer.flush()

    def write_eval(self, prefix: str, ev: dict, step: int) -> None:
        for key in EVAL_KEYS:
            self._scalar(f"{prefix}/{key}", ev.get(key), step)

    def close(self) -> None:
        self.writer.close()

    def _scalar(self, tag: str, value, step: int) -> None:
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.writer.add_scalar(tag, value, step)


def _kind(text: str) -> str | None:
    """The counter an event adds to (the texts of distributed/checkpoints.py, actions.py)."""
    if text.startswith("checkpoint"):
        return "checkpoints"
    if "recovery:" in text:
        return "recoveries"
    return None


def _seconds(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "? s"
