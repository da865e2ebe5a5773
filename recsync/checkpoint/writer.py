"""CheckpointWriter: writes snapshots on a thread of its own, so that training blocks only for
taking the snapshot (a copy of the arrays in memory), not for the disk.

At most one snapshot waits while another is written: ``save`` blocks if two are pending, which
bounds the memory snapshots take. A failed write is raised by the next ``save`` or by ``close``
(nothing fails silently); the files of a failed or interrupted write are never a complete
checkpoint (files.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from recsync.checkpoint import files
from recsync.cluster import storage


class CheckpointWriter:
    def __init__(self, directory: str | Path, keep: int = 3):
        """Sequence numbers continue after the newest checkpoint already in ``directory``."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory, self.keep = Path(directory), keep
        # a staging folder (cluster/storage.py): each checkpoint goes up to its URL once complete
        self.remote = storage.remote_of(self.directory)
        newest = files.manifests(self.directory)
        self.sequence = int(newest[0].stem.split("-")[1]) + 1 if newest else 1
        self.written: list[dict] = []  # {sequence, bytes, write_s} per completed checkpoint
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        # fault injection: called between a checkpoint's data file and its manifest
        self.before_manifest: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def save(self, arrays: dict[str, np.ndarray], meta: dict,
             keep_from: int | None = None) -> int:
        """Queue a snapshot (arrays the caller will not modify: copies) for writing; returns
        its sequence number. ``keep_from``: once it is written, keep the checkpoints from this
        sequence on too (files.prune)."""
        self._raise_error()
        sequence = self.sequence
        self.sequence += 1
        self._queue.put((sequence, arrays, meta, keep_from))
        return sequence

    def flush(self) -> None:
        """Wait until every queued snapshot is written."""
        self._queue.join()
        self._raise_error()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint into {self.directory} failed: "
                               f"{error}") from error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                sequence, arrays, meta, keep_from = item
                begin = time.perf_counter()
                path = files.write(self.directory, sequence, arrays, meta,
                                   self.before_manifest)
                if self.remote is not None:  # the data file first: complete iff manifest
                    storage.push([path.with_suffix(".npz"), path])
                self.written.append({"sequence": sequence, "manifest": str(path),
                                     "bytes": sum(a.nbytes for a in arrays.values()),
                                     "write_s": time.perf_counter() - begin})
                removed = files.prune(self.directory, self.keep, keep_from)
                if self.remote is not None and removed:  # manifests first
                    storage.remove([*removed, *(m.with_suffix(".npz") for m in removed)])
            except BaseException as e:  # noqa: BLE001 - handed to the next save()
                self._error = e
            finally:
                self._queue.task_done()
