"""The error that ends a distributed run."""

from __future__ import annotations


class RunFailed(RuntimeError):
    """The run cannot go on (e.g. a PS shard died without a checkpoint); says which and why.

    ``record`` (set where the run gives up) is what the run recorded up to then, for the
    summary."""

    def __init__(self, message: str, record=None):
        super().__init__(message)
        self.record = record
