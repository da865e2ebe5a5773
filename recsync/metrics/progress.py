"""Progress of long work: a tqdm bar on a terminal, and plain lines every ``LOG_EVERY_S``
seconds where stderr goes to a file (a log, CI, ``nohup``), which tqdm leaves silent."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

LOG_EVERY_S = 30.0


class LogLines:
    """The part of tqdm's interface the run uses, printing a line now and then instead of
    redrawing a bar: ``desc: done/total unit (pct), rate unit/s, postfix, elapsed``."""

    def __init__(self, total: float | None, unit: str, desc: str, every_s: float = LOG_EVERY_S,
                 stream=None):
        self.total, self.unit, self.desc, self.every_s = total, unit, desc, every_s
        self.stream = stream or sys.stderr
        self.n, self.postfix = 0.0, ""
        self.start = self.last = time.perf_counter()

    def update(self, n: float = 1) -> None:
        self.n += n
        if time.perf_counter() - self.last >= self.every_s:
            self._line()

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        if self.n:
            self._line()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line(self) -> None:
        now = time.perf_counter()
        self.last = now
        elapsed = now - self.start
        done = f"{self.n:,.0f}" + (f"/{self.total:,.0f}" if self.total else "")
        pct = f" ({self.n / self.total:.0%})" if self.total else ""
        rate = f", {self.n / elapsed:,.0f} {self.unit}/s" if elapsed > 0 else ""
        extra = f", {self.postfix}" if self.postfix else ""
        units = self.unit if self.unit == "B" else f"{self.unit}s"
        print(f"{self.desc}: {done} {units}{pct}{rate}{extra}, {elapsed:.0f} s",
              file=self.stream, flush=True)


def progress(total: float | None, unit: str, desc: str, enabled: bool = True, **tqdm_args):
    """A bar on a terminal, log lines elsewhere, nothing if not ``enabled``."""
    if enabled and not sys.stderr.isatty():
        return LogLines(total, unit, desc)
    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc,
                disable=None if enabled else True, **tqdm_args)
