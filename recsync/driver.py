"""The run itself: open the data, build the model, train, evaluate, write the output contract.

Outputs (DESIGN §9): ``config.toml`` (resolved config), ``metrics.jsonl`` (one record per logging
interval), ``summary.json`` (at the end, also after Ctrl-C) and ``training.png``.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from recsync.config import RunConfig
from recsync.data.reader import Dataset, chunk_order
from recsync.metrics import MetricsLog, write_json
from recsync.evaluate import evaluate
from recsync.local_run import LocalModel, StepTimer, build_local_model, train_step

CHUNK_BATCHES = 16  # default chunk: this many batches


@dataclass
class Progress:
    """What the loop has done so far, for the logs and the summary."""

    start: float = field(default_factory=time.perf_counter)
    train_start: float | None = None  # when the first step could begin (after start-up)
    train_end: float | None = None
    steps: int = 0
    samples: int = 0
    eval_s: float = 0.0
    evals: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    logged_events: int = 0
    modes: list[dict] = field(default_factory=list)  # {mode, from_s, to_s, cause}, in order
    split: dict = field(default_factory=dict)  # eager: step, compute, wait totals (all workers)
    checkpoints: list[dict] = field(default_factory=list)  # {time_s, sequence, blocked_s, ...}
    recoveries: list[dict] = field(default_factory=list)  # partial: {shard, lost_samples, ...}
    interval_decision: dict | None = None  # recovery.mtbf_s: how the interval was chosen
    train_s_before: float = 0.0  # resumed: training time of the run(s) before
    status: str = "running"
    error: str | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def train_s(self) -> float:
        """Time training ran: start-up, final evaluation and evaluations during it excluded."""
        begin = self.start if self.train_start is None else self.train_start
        end = time.perf_counter() if self.train_end is None else self.train_end
        return end - begin - self.eval_s + self.train_s_before


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

    Raises FileExistsError if ``out_dir`` holds an earlier run's outputs and not ``overwrite``.
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
    progress, result = Progress(), {}
    try:
        if cfg.mode == "local":
            model = build_local_model(cfg.model, cfg.train, ds)
            progress.train_start = time.perf_counter()
            _train(cfg, ds, model, log, progress)
            progress.train_end = time.perf_counter()
            result["eval"] = evaluate(model.dense, model.lookup, ds, ds.rows("eval"), cfg.train.eval_batch_size)
        else:
            from recsync.cluster import ray_session
            from recsync.dist_driver import run_distributed
            with ray_session(cfg.cluster):
                result = run_distributed(cfg, ds, log, progress, out, checkpoint)
        progress.status = "completed"
    except KeyboardInterrupt:
        progress.status = "interrupted"
        progress.train_end = progress.train_end or time.perf_counter()
        print("\nInterrupted: writing the summary of the work done so far.")
        if cfg.mode == "local":
            result["eval"] = evaluate(model.dense, model.lookup, ds, ds.rows("eval"), cfg.train.eval_batch_size)
    except Exception as e:
        from recsync.dist_driver import RunFailed
        if not isinstance(e, RunFailed):
            raise
        progress.status, progress.error = "failed", str(e)
    finally:
        log.close()
    summary = _summary(cfg, ds, progress, result)
    write_json(out / "summary.json", summary)
    if cfg.output.plot:
        from recsync.plot import plot_runs
        plot_runs([out], out / "training.png")
    if progress.error:
        from recsync.dist_driver import RunFailed
        raise RunFailed(progress.error)
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


def _train(cfg: RunConfig, ds: Dataset, model: LocalModel, log: MetricsLog,
           progress: Progress) -> None:
    t = cfg.train
    chunks = ds.chunks("train", cfg.data.chunk_rows or CHUNK_BATCHES * t.batch_size)
    total = t.epochs * ds.rows("train")
    if t.max_steps:
        total = min(total, t.max_steps * t.batch_size)
    eval_every = t.eval_every_samples or max(1, math.ceil(total / 8))
    next_eval = eval_every
    shuffle_seed = t.seed if cfg.data.shuffle else None
    timer = StepTimer()
    bar = tqdm(total=total, unit="sample", unit_scale=True, desc=f"train ({cfg.mode})",
               disable=None if cfg.output.progress else True, smoothing=0.1)
    try:
        for epoch in range(t.epochs):
            for chunk in chunk_order(chunks, epoch=epoch, shuffle_seed=shuffle_seed):
                for batch in ds.batches(chunk, t.batch_size, shuffle_seed=shuffle_seed,
                                        epoch=epoch):
                    loss = train_step(model, batch)
                    progress.steps += 1
                    progress.samples += len(batch)
                    timer.add(len(batch), loss)
                    bar.update(len(batch))
                    eval_now = progress.samples >= next_eval
                    if eval_now or progress.steps % cfg.output.log_every_steps == 0:
                        record = _interval_record(cfg, progress, timer)
                        bar.set_postfix(loss=f"{record['loss']:.4f}")
                        if eval_now:
                            record["eval"] = _timed_eval(cfg, ds, model, progress)
                            next_eval += eval_every
                        log.write(record)
                        timer.reset()
                    if t.max_steps and progress.steps >= t.max_steps:
                        return
    finally:
        if timer.steps:  # the steps since the last record (also on Ctrl-C)
            log.write(_interval_record(cfg, progress, timer))
        bar.close()


def _interval_record(cfg: RunConfig, progress: Progress, timer: StepTimer) -> dict:
    interval_s = time.perf_counter() - timer.start
    return {"time_s": progress.elapsed(), "samples": progress.samples, "step": progress.steps,
            "loss": timer.loss_sum / max(timer.samples, 1),
            "samples_per_s": timer.samples / interval_s if interval_s > 0 else None,
            "mode": cfg.mode, "worker_step_s": [interval_s / max(timer.steps, 1)],
            "staleness": None, "events": [], "eval": None}


def _timed_eval(cfg: RunConfig, ds: Dataset, model: LocalModel, progress: Progress) -> dict:
    start = time.perf_counter()
    result = evaluate(model.dense, model.lookup, ds, cfg.train.eval_sample_rows, cfg.train.eval_batch_size)
    progress.eval_s += time.perf_counter() - start
    result.update(samples=progress.samples, time_s=progress.elapsed())
    progress.evals.append(result)
    return result


def _summary(cfg: RunConfig, ds: Dataset, progress: Progress, result: dict) -> dict:
    train_s = progress.train_s()
    synthetic = ds.synthetic or {}
    final = result.get("eval") or {"auc": None, "logloss": None, "rows": 0}
    wall_s = progress.elapsed()
    distributed = cfg.mode != "local"
    staleness = _staleness(result.get("shards", []))
    modes = ([{**m, "to_s": wall_s if m["to_s"] is None else m["to_s"]} for m in progress.modes]
             or [{"mode": cfg.mode, "from_s": 0.0, "to_s": wall_s, "cause": "config"}])
    return {
        "status": progress.status,
        "error": progress.error,
        "mode": modes[-1]["mode"],
        "modes": modes,
        "workers": cfg.cluster.workers if distributed else 1,
        "ps_shards": cfg.cluster.ps_shards if distributed else 0,
        "samples": progress.samples,
        "steps": progress.steps,
        "wall_s": wall_s,
        "train_s": train_s,
        "samples_per_s": progress.samples / train_s if train_s > 0 else None,
        "eval": {**final, "bayes_auc": synthetic.get("bayes_auc"),
                 "bayes_logloss": synthetic.get("bayes_logloss")},
        "evals": progress.evals,
        "staleness": staleness,
        "gba": (_gba_counts(result.get("shards", []))
                if any(m["mode"] == "gba" for m in modes) else None),
        "shadow": _shadow_summary(cfg, result.get("shadow")),
        "eager": _eager_summary(cfg, result.get("eager"), progress.split),
        "network_emulated": ({"latency_ms": cfg.network.latency_ms,
                              "ms_per_mb": cfg.network.ms_per_mb}
                             if cfg.network.enabled and distributed else None),
        "per_worker": _per_worker(result),
        "per_shard": [{k: st[k] for k in ("version", "pulls", "pushes", "rows_touched",
                                          "samples_applied")}
                      for st in result.get("shards", [])],
        "queue": {k: v for k, v in result.get("queue", {}).items() if k != "by_worker"},
        "failures": [e for e in progress.events if "killed" in e["event"]],
        "recovery": _recovery_summary(cfg, progress, result, train_s),
        "stragglers_emulated": bool(cfg.faults.stragglers),
        "data": str(cfg.data.path),
    }


def _recovery_summary(cfg: RunConfig, progress: Progress, result: dict,
                      train_s: float) -> dict:
    """Checkpoints taken, what was written, the failures recovered from, and what it all cost:
    ``overhead`` = training time blocked by checkpoints (snapshots; sync: the pause), without
    training after a failure (from the kill to the restarted shard serving; full recovery:
    to fresh workers training again) and lost (full recovery: the training since the
    checkpoint rolled back to, done again), each in seconds and as a fraction of training time.
    ``pls`` (partial recovery): for each shard failure, the samples trained between its
    restored checkpoint and its death, over the samples of the run, over the number of shards
    (each shard holds 1 / S of the model)."""
    r = cfg.recovery
    blocked = sum(c["blocked_s"] for c in progress.checkpoints)
    written = result.get("checkpoints_written") or []
    downtime = sum(x.get("downtime_s", 0.0) for x in progress.recoveries)
    lost_work = sum(x.get("lost_work_s", 0.0) for x in progress.recoveries)
    total = blocked + downtime + lost_work
    lost = sum(x["lost_samples"] for x in progress.recoveries)
    pls = None
    if r.kind != "none" and progress.samples:
        pls = lost / progress.samples / cfg.cluster.ps_shards
    partial_saves = sum(1 for c in progress.checkpoints for x in c["partial"] if x)
    final = result.get("final_checkpoint")
    return {"kind": None if r.kind == "none" else r.kind,
            "rows": r.rows if r.kind == "partial" else None,
            "pls": pls,
            "samples_redone": sum(x.get("samples_redone", 0) for x in progress.recoveries),
            "recoveries": progress.recoveries,
            "interval_decision": progress.interval_decision,
            "checkpoints": len(progress.checkpoints),
            "partial_checkpoints": partial_saves,
            "overhead": {"checkpoint_blocked_s": blocked, "downtime_s": downtime,
                         "lost_work_s": lost_work, "total_s": total,
                         "frac": total / train_s if train_s else None},
            "checkpoint_overhead_frac": blocked / train_s if progress.checkpoints and train_s
            else None,
            "checkpoint_blocked_s": blocked,
            "checkpoint_dir": (str(result["checkpoint_dir"]) if result.get("checkpoint_dir")
                               else None),
            "final_job_checkpoint": final and final["job_sequence"],
            "written_per_shard": [len(w) for w in written],
            "write_s_mean": (sum(x["write_s"] for w in written for x in w)
                             / max(1, sum(len(w) for w in written))) if any(written) else None}


def _shadow_summary(cfg: RunConfig, per_worker: list[dict] | None) -> dict | None:
    """Modes shadow and foreground: how often the replicas were synchronized while training.
    ``sync_gap``: a trainer's training iterations (all its threads') between two syncs."""
    if not per_worker:
        return None
    sh = cfg.shadow
    gaps = _merged_counts(w["gaps"] for w in per_worker)
    rounds = sum(w["rounds"] + w["final_rounds"] for w in per_worker)
    return {
        "algorithm": sh.algorithm, "background": cfg.mode == "shadow",
        "hogwild_threads": sh.hogwild_threads,
        "min_interval_s": sh.min_interval_s if cfg.mode == "shadow" else None,
        "foreground_every": sh.foreground_every if cfg.mode == "foreground" else None,
        "syncs": [w["rounds"] for w in per_worker],
        "syncs_per_s": [w["rounds"] / w["train_s"] if w["train_s"] > 0 else None
                        for w in per_worker],
        "final_syncs": [w["final_rounds"] for w in per_worker],
        "sync_gap": _distribution(gaps),
        "sync_s_mean": (sum(w["round_s"] for w in per_worker) / rounds) if rounds else None,
        "threads_left_running": sum(w["threads_alive"] for w in per_worker),
    }


def _eager_summary(cfg: RunConfig, per_worker: list[dict] | None, split: dict) -> dict | None:
    """Mode eager: the staleness τ each update's worker knew of, the learning-rate multipliers
    m(τ) applied, and where a step's time went (means per step over all workers' steps)."""
    if not per_worker:
        return None
    taus = _merged_counts(w["taus"] for w in per_worker)
    updates = sum(w["updates"] for w in per_worker)
    steps = split.get("interval_steps", 0)
    return {
        "overlap": cfg.eager.overlap, "lr_modulation": cfg.eager.lr_modulation,
        "tau": _distribution(taus),
        "multiplier": {"mean": sum(w["multiplier_sum"] for w in per_worker) / updates
                       if updates else None,
                       "min": min(w["multiplier_min"] for w in per_worker) if updates else None,
                       "updates": updates},
        "iteration_s": {k.removesuffix("_s"): split[k] / steps
                        for k in ("step_s", "compute_s", "pull_wait_s", "push_wait_s")}
                       if steps else None,
    }


def _gba_counts(shard_stats: list[dict]) -> dict:
    """GBA's gradients applied (decayed ones included), decayed and dropped, and updates made.
    Each shard judges every gradient it receives on its own (a push reaches every shard), so
    the totals count shard-gradients; ``per_shard`` has each shard's counts."""
    per_shard = [st["gba"] for st in shard_stats]
    return {**{k: sum(c[k] for c in per_shard) for k in ("applied", "decayed", "dropped")},
            "per_shard": per_shard}


def _staleness(shard_stats: list[dict]) -> dict:
    """Mean, p99 and max staleness of every applied gradient, over all shards."""
    return _distribution(_merged_counts(st["staleness"] for st in shard_stats))


def _merged_counts(parts) -> dict[int, int]:
    """{value: how many} summed over parts (keys may be strings: JSON and Ray hand them so)."""
    counts: dict[int, int] = {}
    for part in parts:
        for k, n in part.items():
            counts[int(k)] = counts.get(int(k), 0) + n
    return counts


def _distribution(counts: dict[int, int]) -> dict:
    """Mean, p99 and max of integer values given as {value: how many times}."""
    if not counts:
        return {"mean": None, "p99": None, "max": None}
    values = sorted(counts)
    total = sum(counts.values())
    p99, seen = values[-1], 0
    for v in values:
        seen += counts[v]
        if seen >= 0.99 * total:
            p99 = v
            break
    return {"mean": sum(v * n for v, n in counts.items()) / total, "p99": p99,
            "max": values[-1]}


def _per_worker(result: dict) -> list[dict]:
    by_worker = result.get("queue", {}).get("by_worker", {})
    return [{"rank": s["rank"], "steps": s["steps"], "samples": s["samples"],
             "chunks": by_worker.get(str(s["rank"]), {}).get("chunks", 0)}
            for s in result.get("statuses", [])]
