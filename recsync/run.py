"""A run from start to end: prepare the output directory, train (locally, or on Ray), write the
output contract.

Outputs (docs/design.md §9): ``config.toml`` (resolved config), ``metrics.jsonl`` (one record
per logging interval), ``summary.json`` (at the end, also after Ctrl-C or a failure) and
``training.png``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from recsync.config import RunConfig
from recsync.data.reader import Dataset
from recsync.distributed.errors import RunFailed
from recsync.local_run import final_eval, run_local
from recsync.metrics import MetricsLog, write_json
from recsync.record import RunRecord
from recsync.summary import build_summary

RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "training.png")


def prepare_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse to mix a new run into an earlier one's outputs, unless told to replace them."""
    existing = [f for f in (*RUN_FILES, "checkpoints") if (out / f).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds the outputs of a run ({', '.join(existing)}); "
                              f"choose another --out or pass --overwrite to replace them")
    for f in existing:
        if (out / f).is_dir():
            shutil.rmtree(out / f)
        else:
            (out / f).unlink()
    out.mkdir(parents=True, exist_ok=True)


def run(cfg: RunConfig, out_dir: str | Path, *, overwrite: bool = False,
        resume: bool = False) -> dict:
    """Train as ``cfg`` says, write outputs into ``out_dir``, return the summary.

    Raises FileExistsError if ``out_dir`` holds an earlier run's outputs and not ``overwrite``,
    and RunFailed (after writing the summary) if the run could not go on.
    ``resume``: go on with the run in ``out_dir`` (``cfg`` is its config.toml) from its newest
    complete job checkpoint; metrics.jsonl is appended to.
    """
    out = Path(out_dir)
    checkpoint = None
    if resume:
        checkpoint = resume_point(cfg, out)
    else:
        prepare_run_dir(out, overwrite)
        (out / "config.toml").write_text(cfg.to_toml())
    torch.set_num_threads(cfg.train.threads)
    ds = Dataset(cfg.data.path)
    log = MetricsLog(out / "metrics.jsonl")
    started = time.perf_counter()
    status, failure, result, record = "completed", None, {}, None
    try:
        if cfg.mode == "local":
            result = run_local(cfg, ds, log, started)
        else:
            from recsync.cluster import ray_session
            from recsync.distributed.train import run_distributed
            with ray_session(cfg.cluster):
                result = run_distributed(cfg, ds, log, out, checkpoint, started=started)
    except KeyboardInterrupt as e:
        status, record = "interrupted", getattr(e, "record", None)
        print("\nInterrupted: writing the summary of the work done so far.")
        if getattr(e, "model", None) is not None:  # local: evaluate the work done so far
            result = {"eval": final_eval(cfg, ds, e.model)}
    except RunFailed as e:
        status, failure, record = "failed", e, e.record
    finally:
        log.close()
    record = result.get("record") or record or RunRecord(start=started)
    summary = build_summary(cfg, ds, record, result, status, failure and str(failure))
    write_json(out / "summary.json", summary)
    if cfg.output.plot:
        from recsync.plot import plot_runs
        plot_runs([out], out / "training.png")
    if failure is not None:
        raise failure
    return summary


def resume_point(cfg: RunConfig, out: Path):
    """The job checkpoint to resume the run in ``out`` from; ValueError says why there is
    none (or that the run completed)."""
    from recsync.checkpoint import job
    root = Path(cfg.recovery.dir) if cfg.recovery.dir else out / "checkpoints"
    if cfg.mode == "local" or not (cfg.recovery.checkpoint_every_s or cfg.recovery.mtbf_s):
        raise ValueError(f"{out}/config.toml: the run wrote no checkpoints to resume from "
                         f"(recovery.checkpoint_every_s and recovery.mtbf_s are 0)")
    ckpt, skipped = job.restorable(root)
    if ckpt is None:
        raise ValueError(f"{job.job_dir(root)}: no complete job checkpoint to resume from"
                         + (f" ({'; '.join(skipped)})" if skipped else ""))
    if ckpt.meta["final"]:
        raise ValueError(f"{out}: the run completed (its final checkpoint is "
                         f"{ckpt.manifest_path}); nothing to resume")
    ckpt.skipped = skipped
    return ckpt
