"""Checks before any actor starts, so that a run refused is refused in a second, with nothing
written, instead of minutes in with a traceback: the data set opens (and is a valid one), its
tables fit in memory, the output and checkpoint directories exist or can be made and are
writable, and their file systems have room for what the run writes (an estimate, shown beside
the free space); optional packages the config asks for (tensorboard) are installed."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recsync.cluster import storage
from recsync.config import RunConfig
from recsync.data.format import DataFormatError
from recsync.data.reader import Dataset
from recsync.embedding.memory import check_table_memory, table_bytes
from recsync.model.setup import model_for

DEFAULT_DATA = "runs/data/synth"
METRICS_BYTES = 2 << 20  # metrics.jsonl, summary.json, training.png of a run: a few MB at most
FLOAT = 4


@dataclass
class WriteEstimate:
    """What a run writes into one directory, in bytes, and in what."""

    directory: Path
    nbytes: int
    what: str


def preflight(cfg: RunConfig, out: Path) -> Dataset:
    """Open the data set and check every path the run writes to; ValueError (one line,
    naming the path) if the run cannot start. Prints the free space against the estimate."""
    if cfg.output.tensorboard:
        from recsync.metrics.tb_sink import require_tensorboard
        require_tensorboard()
    check_gpu_mode(cfg)
    warn_caveat(cfg)
    ds = open_data(cfg)
    ds.hold_out(cfg.train.validation)  # the validation slice (too large: refused here)
    for split in ("train", "eval"):
        ds.parts(split)  # every part file's header against meta.json, here and not in an actor
    tables = model_for(cfg.model, ds).tables  # the model's own errors (a bad name) here too
    check_table_memory(held_rows(cfg, tables), max(t.dim for t in tables),
                       extra_bytes=dynamic_metadata_bytes(cfg, tables),
                       state_dim=_state_dim(cfg), table_names=[t.name for t in tables])
    estimates = estimate_writes(cfg, ds, out)
    for e in estimates:
        free = check_writable(e.directory)
        if free < e.nbytes:
            raise ValueError(f"{e.directory}: {_size(free)} free on its file system; this run "
                             f"writes about {_size(e.nbytes)} there ({e.what}); free space or "
                             f"choose another directory")
        print(f"preflight: {e.directory}: {_size(free)} free, the run writes about "
              f"{_size(e.nbytes)} ({e.what})", file=sys.stderr)
    return ds


def held_rows(cfg: RunConfig, tables) -> list[int]:
    """Rows each table can hold in the whole run: a fixed table's ``rows``; a dynamic table's
    capacity on every shard (on the one store of a local run)."""
    stores = cfg.cluster.ps_shards if cfg.distributed else 1
    return [t.rows if t.dynamic is None else t.dynamic.capacity * stores for t in tables]


def dynamic_metadata_bytes(cfg: RunConfig, tables) -> int:
    """What the run's dynamic tables hold besides rows (their maps), on every store."""
    from recsync.embedding.dynamic_table import metadata_bytes
    stores = cfg.cluster.ps_shards if cfg.distributed else 1
    return stores * sum(metadata_bytes(t) for t in tables if t.dynamic is not None)


def warn_caveat(cfg: RunConfig) -> None:
    """Say the mode's measured shortfall at these settings, if it has one (Mode.caveat)."""
    from recsync.modes import MODES
    mode = MODES.get(cfg.mode)
    caveat = mode.caveat(cfg) if mode is not None else None
    if caveat:
        print(f"warning: mode {cfg.mode}: {caveat}", file=sys.stderr, flush=True)


def check_gpu_mode(cfg: RunConfig) -> None:
    """``cluster.worker_gpus`` only where the mode's workers can compute on a GPU."""
    from recsync.modes import MODES
    if cfg.cluster.worker_gpus <= 0:
        return
    mode = MODES.get(cfg.mode)
    if mode is None or not mode.gpu_workers:
        able = ", ".join(name for name, m in MODES.items() if m.gpu_workers)
        raise ValueError(f"cluster.worker_gpus = {cfg.cluster.worker_gpus:g}: mode {cfg.mode!r} "
                         f"trains on the CPU; GPU workers run modes {able}")


def open_data(cfg: RunConfig) -> Dataset:
    """The run's data set, opened (and so checked); the error says how to make one. A URL's
    data set is fetched to this node first (cluster/storage.py)."""
    try:
        path = storage.local_data(cfg.data.path)
    except (OSError, ValueError) as e:
        raise DataFormatError(f"data.path = {cfg.data.path!r}: cannot fetch the data set "
                              f"({e})") from None
    if not path.exists():
        default = " (the default)" if str(cfg.data.path) == DEFAULT_DATA else ""
        raise DataFormatError(f"data.path = {str(path)!r}{default}: no data set there; make one "
                              f"with `recsync data synth --rows 1000000 --out {path}` or "
                              f"`recsync data criteo FILE... --out {path}`, or set data.path")
    try:
        return Dataset(path)
    except OSError as e:
        raise DataFormatError(f"{path}: cannot read the data set ({e.strerror or e})") from None


def _state_dim(cfg: RunConfig) -> int:
    return 0 if cfg.train.embedding_optimizer == "sgd" else 1


def model_bytes(cfg: RunConfig, ds: Dataset) -> int:
    """Bytes of the model's state a checkpoint holds: every table's rows with their row
    optimizer's state, the dense parameters with two optimizer slots (an upper bound for the
    optimizers recsync has)."""
    built = model_for(cfg.model, ds)
    dense = sum(p.numel() for p in built.module.parameters())
    return (table_bytes(held_rows(cfg, built.tables), max(t.dim for t in built.tables),
                        _state_dim(cfg))
            + 3 * dense * FLOAT)


def estimate_writes(cfg: RunConfig, ds: Dataset, out: Path) -> list[WriteEstimate]:
    """What the run writes into --out and its checkpoint directory (one entry where they are
    on the same file system)."""
    estimates = [WriteEstimate(out, METRICS_BYTES, "metrics, summary, plot")]
    r = cfg.recovery
    if cfg.distributed and (r.checkpoint_every_s or r.mtbf_s):
        root = storage.local(r.dir) if r.dir else out / "checkpoints"
        copies = r.keep + 2  # kept ones, one being written, one more a job checkpoint holds
        ckpt = WriteEstimate(root, copies * model_bytes(cfg, ds),
                             f"{copies} checkpoints of {_size(model_bytes(cfg, ds))}")
        if _device(root) == _device(out):
            estimates[0] = WriteEstimate(out, estimates[0].nbytes + ckpt.nbytes,
                                         f"{ckpt.what} and the run's outputs")
        else:
            estimates.append(ckpt)
    if cfg.output.save_model:  # OUT/model: at most every row, with its id (model_dir/)
        rows = sum(held_rows(cfg, model_for(cfg.model, ds).tables))
        nbytes = model_bytes(cfg, ds) + 8 * rows
        estimates[0] = WriteEstimate(out, estimates[0].nbytes + nbytes,
                                     f"{estimates[0].what}; model/ up to {_size(nbytes)}")
    return estimates


def check_writable(directory: Path) -> int:
    """The free bytes where ``directory`` is (or would be made); ValueError if it cannot be
    made or written. Probes with a real temporary file: permissions, a read-only mount and a
    file in the way are all found this way."""
    directory = Path(directory)
    existing = _nearest_existing(directory)
    if not existing.is_dir():
        raise ValueError(f"{directory}: cannot be made: {existing} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".recsync-probe-"):
            pass
    except OSError as e:
        raise ValueError(f"{directory}: not writable ({e.strerror or e})") from None
    return shutil.disk_usage(existing).free


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _device(path: Path) -> int:
    return os.stat(_nearest_existing(Path(path))).st_dev


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
