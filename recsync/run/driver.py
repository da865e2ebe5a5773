"""A run from start to end: prepare the output directory, train (locally, or on Ray), write the
output contract.

Outputs (docs/design.md §9): ``config.toml`` (resolved config), ``metrics.jsonl`` (one record
per logging interval), ``summary.json`` (at the end, also after Ctrl-C or a failure),
``training.png``, with ``output.save_predictions``, ``predictions.parquet`` and, with
``output.tensorboard``, TensorBoard event files in ``tb/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from recsync.cluster import storage
from recsync.config import RunConfig
from recsync.metrics.core import MetricsLog, write_json
from recsync.ps import channel_shm
from recsync.run.local_run import final_eval, run_local
from recsync.run.predictions import FILE as PREDICTIONS
from recsync.run.predictions import save_predictions
from recsync.run.preflight import preflight
from recsync.run.record import RunRecord
from recsync.run.signals import (KILLED_WRITER_WAIT_S, catch_signals, ending,
                                 keep_signals_from_ray, pid_alive, remove_temp_files)
from recsync.run.summary import build_summary
from recsync.run.warm_start import load_warm_start

RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "training.png", PREDICTIONS, "tb",
             "model", "scale.jsonl")


def prepare_run_dir(out: Path, overwrite: bool) -> None:
    """Refuse to mix a new run into an earlier one's outputs, unless told to replace them, or
    unless the earlier run ended before it trained anything (its outputs hold nothing)."""
    existing = _run_files(out)
    if existing and not overwrite and not _trained_nothing(_text(out / "summary.json")):
        raise FileExistsError(f"{out} already holds the outputs of a run ({', '.join(existing)}); "
                              f"choose another --out or pass --overwrite to replace them")
    for f in existing:
        if (out / f).is_dir():
            shutil.rmtree(out / f)
        else:
            (out / f).unlink()
    out.mkdir(parents=True, exist_ok=True)


def _run_files(out: Path) -> list[str]:
    return [f for f in (*RUN_FILES, "checkpoints") if (out / f).exists()]


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _trained_nothing(summary_text: str | None) -> bool:
    """The run whose summary.json this is failed or was stopped before its first step: nothing
    of it is lost by starting again there (a checkpoint it wrote holds the untrained model)."""
    try:
        summary = json.loads(summary_text or "")
    except ValueError:
        return False
    return summary.get("status") != "completed" and not summary.get("samples")


def run(cfg: RunConfig, out_dir: str | Path, *, overwrite: bool = False,
        resume: bool = False, on_eval: Callable[[dict], object] | None = None) -> dict:
    """Train as ``cfg`` says, write outputs into ``out_dir``, return the summary.

    Raises FileExistsError if ``out_dir`` holds an earlier run's outputs and not ``overwrite``,
    ValueError (nothing written) if the preflight checks refuse the run, RunFailed (after
    writing the summary) if the run could not go on, and Interrupted (after writing the summary)
    on SIGINT, SIGTERM or SIGHUP. ``resume``: go on with the run in ``out_dir`` (``cfg`` is its
    config.toml) from its newest complete job checkpoint; metrics.jsonl is appended to.
    ``on_eval``: called in this process, in every mode, with each evaluation on the validation
    slice (train.validation) as it ends: its record (``samples``, ``logloss``, ``auc``, ...,
    as metrics.jsonl's ``eval``); what it raises ends the run (recsync tune reports each one to
    its trial through it, recsync/tuning/trial.py).
    """
    out = storage.local(out_dir)  # a URL: its staging folder, uploaded as the run goes
    started = time.perf_counter()
    if storage.is_url(out_dir):
        check_remote_out(out, overwrite, resume)
    checkpoint = resume_point(cfg, out) if resume else None
    ds = preflight(cfg, out)
    cfg = resolved_for_data(cfg, ds)
    # a warm start (train.init_from), checked before anything starts; a resumed run goes on
    # from its checkpoint instead
    warm = load_warm_start(cfg, ds) if cfg.train.init_from and not resume else None
    if not resume:
        prepare_run_dir(out, overwrite)
        (out / "config.toml").write_text(cfg.to_toml())
        storage.push([out / "config.toml"])  # a run killed at once can be resumed
    elif checkpoint.changes:  # e.g. other cluster.ps_shards: config.toml is the run's config
        print(f"resuming with {'; '.join(checkpoint.changes)}", flush=True)
        tmp = out / f".config.toml.tmp-{os.getpid()}"
        tmp.write_text(cfg.to_toml())
        os.replace(tmp, out / "config.toml")
    torch.set_num_threads(cfg.train.threads)
    status, cause, raised, result, record = "completed", None, None, {}, None
    with catch_signals() as signals:
        log = None
        try:
            log = MetricsLog(out / "metrics.jsonl", out / "tb" if cfg.output.tensorboard else None,
                             upload_every_s=cfg.output.upload_every_s)
            try:
                if not cfg.distributed:
                    result = run_local(cfg, ds, log, started, warm, on_eval)
                else:
                    from recsync.cluster.ray_session import ray_session, runtime_env_for
                    from recsync.distributed.train import run_distributed
                    keep_signals_from_ray()
                    with ray_session(cfg.cluster, runtime_env_for(cfg.cluster, cfg.model.name)):
                        signals.install()  # again: ray.init installed handlers of its own
                        try:
                            result = run_distributed(cfg, ds, log, out, checkpoint,
                                                     started=started, warm=warm,
                                                     on_eval=on_eval)
                        finally:  # however it ended: Ray's shutdown is not interrupted
                            signals.stopping()
                log.final_eval(result.get("eval"), result["record"].samples)
            finally:
                signals.stopping()
                if log is not None:
                    with contextlib.suppress(OSError):  # a full disk: the summary says so
                        log.close()
        except BaseException as e:  # noqa: BLE001 - every ending writes its summary
            status, cause, raised = ending(e, signals.received)
            record = getattr(e, "record", None)
            if status == "interrupted":
                print(f"\nInterrupted ({cause}): writing the summary of the work done so far.",
                      file=sys.stderr)
                if getattr(e, "model", None) is not None:  # local: evaluate the work done
                    result = {"eval": final_eval(cfg, ds, e.model)}
        record = result.get("record") or record or RunRecord(start=started)
        if status == "completed" and cfg.output.save_model:
            result["model_dir"] = _save_model(cfg, ds, out, result, record)
        remove_temp_files(out, checkpoint_root(cfg, out) if cfg.distributed else None,
                          wait_s=0.0 if status == "completed" else KILLED_WRITER_WAIT_S)
        if cfg.distributed:  # this machine's answer slots of workers killed making one
            channel_shm.remove_orphans(pid_alive)
        result["predictions"] = save_predictions(out, result)  # the arrays leave the result
        summary = build_summary(cfg, ds, record, result, status, cause)
        write_outputs(cfg, out, summary)
        upload_outputs(out)
    if raised is not None:
        raise raised
    return summary


def _save_model(cfg: RunConfig, ds, out: Path, result: dict, record: RunRecord) -> dict | None:
    """OUT/model/ of a completed run (recsync/model_dir): the local run's model, or what a
    distributed run's finish gathered from its shards."""
    from recsync.model_dir.state import local_state, save_model
    if not cfg.distributed:
        state = local_state(result["model"], cfg.output.save_optimizer_state)
    else:
        state = result.get("model_state")
    if state is None:
        return None
    mode = record.modes[-1]["mode"] if record.modes else cfg.mode
    return save_model(out, cfg, ds, state, record, result.get("eval"), mode)


def resolved_for_data(cfg: RunConfig, ds) -> RunConfig:
    """``cfg`` with the values that depend on the data set resolved (config.toml, written
    from it, shows what the run used): train.dense_warmup_steps = -1."""
    workers = cfg.cluster.workers if cfg.distributed else 1
    warmup = cfg.train.warmup_for(ds.rows("train"), workers)
    if warmup == cfg.train.dense_warmup_steps:
        return cfg
    return cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"dense_warmup_steps": warmup})})


def write_outputs(cfg: RunConfig, out: Path, summary: dict) -> None:
    """summary.json and the plot; where the disk is full, the summary goes to stderr."""
    try:
        write_json(out / "summary.json", summary)
    except OSError as e:
        remove_temp_files(out, None)
        print(f"error: could not write {out / 'summary.json'} ({e.strerror}); the summary:\n"
              f"{json.dumps(summary, default=str)}", file=sys.stderr)
        return
    if cfg.output.plot:
        from recsync.metrics.plot import plot_runs
        try:
            plot_runs([out], out / "training.png")
        except OSError as e:
            print(f"warning: could not write {out / 'training.png'}: {e}", file=sys.stderr)


def checkpoint_root(cfg: RunConfig, out: Path) -> Path:
    return storage.local(cfg.recovery.dir) if cfg.recovery.dir else out / "checkpoints"


def check_remote_out(out: Path, overwrite: bool, resume: bool) -> None:
    """--out URL: a resumed run fetches the run's folder first. A new one refuses a URL that
    holds an earlier run's outputs, as a local --out does (with ``overwrite``, or where that
    run trained nothing: removes them there), and a staging folder holding outputs that are
    not at the URL (an upload that failed: its files are the only copy)."""
    if resume:
        storage.pull_dir(out)
        return
    url = storage.remote_of(out)
    earlier = storage.remote_names(out) & {*RUN_FILES, "checkpoints"}
    if earlier and not overwrite and not _trained_nothing(storage.remote_text(
            out / "summary.json")):
        raise FileExistsError(f"{url} already holds the outputs of a run "
                              f"({', '.join(sorted(earlier))}); choose another --out or pass "
                              f"--overwrite to replace them")
    staged = _run_files(out)
    if (staged and not earlier and not overwrite
            and not _trained_nothing(_text(out / "summary.json"))):
        raise FileExistsError(f"{out} (the staging folder of {url}) holds the outputs of a run "
                              f"that are not at the URL ({', '.join(staged)}): an upload "
                              f"failed? Upload or move them, or pass --overwrite to replace them")
    storage.remove_tree(out, earlier)
    if out.exists():  # the staging folder of an earlier run there: a copy, now stale
        shutil.rmtree(out)


def upload_outputs(out: Path) -> None:
    """--out URL: everything the run wrote goes up (an error leaves it in ``out``)."""
    if storage.remote_of(out) is None:
        return
    try:
        sent = storage.push_tree(out)
        print(f"outputs: {sent} files uploaded to {storage.remote_of(out)}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - nothing is lost: the files stay here
        print(f"error: could not upload the outputs to {storage.remote_of(out)} ({e}); they "
              f"are in {out}", file=sys.stderr)


def resume_point(cfg: RunConfig, out: Path):
    """The job checkpoint to resume the run in ``out`` from; ValueError says why there is
    none (or that the run completed, or ``cfg`` changes a key a resumed run must keep:
    checkpoint/resume_config.py). Its ``changes`` lists the keys ``cfg`` changes."""
    from recsync.checkpoint import job
    from recsync.checkpoint.resume_config import check_resume_config
    root = checkpoint_root(cfg, out)
    storage.pull_dir(root)  # recovery.dir at a URL: its checkpoints, fetched
    if not cfg.distributed or not (cfg.recovery.checkpoint_every_s or cfg.recovery.mtbf_s):
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
    ckpt.changes = []
    if "config" in ckpt.meta:  # (job checkpoints from before resharding do not have it)
        ckpt.changes = check_resume_config(ckpt.meta["config"], cfg.model_dump(mode="json"),
                                           f"{out / 'config.toml'}")
    return ckpt
