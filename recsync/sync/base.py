"""What every sync mode shares."""

STOP = "stop"
"""returned by ``step`` when no worker has data left: the run is over for everyone. A value, not
an ``object()``: Ray may serialize the worker class by value, and identity does not survive."""


class Mode:
    """A sync mode: ``step(batch | None) -> loss | None | STOP`` and ``finish()``.

    ``after_compute(compute_s)`` is called between computing a step's gradients and sending
    them (push or all-reduce), with the time forward and backward took; the worker replaces it
    to count compute time and to emulate a straggler, whose gradients then arrive late and
    stale as a slow machine's would. ``pause_requested()`` says whether the driver asked this
    worker to pause (the worker replaces it too).
    """

    def after_compute(self, compute_s: float) -> None:
        pass

    def pause_requested(self) -> bool:
        return False

    def agreed_pause(self) -> bool:
        """After a step: whether to pause now. PS modes: as soon as asked."""
        return self.pause_requested()
