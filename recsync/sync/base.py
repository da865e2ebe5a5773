"""What every sync mode shares."""

import time

STOP = "stop"
"""returned by ``step`` when no worker has data left: the run is over for everyone. A value, not
an ``object()``: Ray may serialize the worker class by value, and identity does not survive."""


class Mode:
    """A sync mode: ``step(batch | None) -> loss | None | STOP`` and ``finish()``.

    ``slow_down(compute_s)`` is called between computing a step's gradients and sending them
    (push or all-reduce), with the time forward and backward took; the worker replaces it to
    emulate a straggler, whose gradients then arrive late and stale as a slow machine's would.
    """

    def slow_down(self, compute_s: float) -> None:
        pass

    @staticmethod
    def clock() -> float:
        return time.perf_counter()
