"""summary.json, built in one place from what a run returns: its record (recsync/run/record.py:
counts, events, checkpoints, recoveries, modes) and its result (the final evaluation,
the shards' and workers' figures, the queue's counts)."""

from __future__ import annotations

import statistics

from recsync.cluster.emulation import label_of, shadow_cores, shard_entry, worker_entry
from recsync.metrics.stats import distribution, merged_counts
from recsync.modes import MODES


def build_summary(cfg, ds, record, result: dict, status: str, error: str | None) -> dict:
    train_s = record.train_s()
    synthetic = ds.synthetic or {}
    final = result.get("eval") or {"auc": None, "logloss": None, "ne": None, "calibration": None,
                                   "rows": 0}
    wall_s = record.elapsed()
    distributed = cfg.distributed
    shards = result.get("shards", [])
    end_s = record.time_s()  # the training clock's end (modes' periods are on that clock)
    modes = ([{**m, "to_s": end_s if m["to_s"] is None else m["to_s"]} for m in record.modes]
             or [{"mode": cfg.mode, "from_s": 0.0, "to_s": end_s, "cause": "config"}])
    return {
        "status": status,
        "error": error,
        "mode": modes[-1]["mode"],
        "modes": modes,
        "workers": cfg.cluster.workers if distributed else 1,  # an elastic run's max
        "elastic": record.elastic,  # its worker count over time (distributed/elastic.py)
        "ps_shards": cfg.cluster.ps_shards if distributed else 0,
        "samples": record.samples,
        "steps": record.steps,
        "wall_s": wall_s,
        "startup_s": record.startup_s(),
        "train_s": train_s,
        "samples_per_s": record.samples / train_s if train_s > 0 else None,
        "eval": {**final, "bayes_auc": synthetic.get("bayes_auc"),
                 "bayes_logloss": synthetic.get("bayes_logloss")},
        "evals": record.evals,
        # why training ended and the best validation evaluation (run/selection.py)
        "stopped": record.stopped or {"reason": None if status == "completed" else status,
                                      "patience": None, "validation_evals": None,
                                      "best_eval": None},
        "predictions": result.get("predictions"),  # {"path", "rows"}: output.save_predictions
        "periodic_eval": {"every_samples": record.eval_every or None,
                          "split": "validation" if cfg.train.validation else "eval",
                          "validation_rows": ds.rows("validation") or None,
                          "rows": cfg.train.eval_sample_rows, "count": len(record.evals),
                          "skipped": record.evals_skipped, "eval_s": record.eval_total_s,
                          "paused_s": record.eval_s},
        "staleness": staleness(shards),
        **mode_sections(cfg, [m["mode"] for m in modes], result.get("mode_stats"), shards,
                        record.waits),
        "network_emulated": ({"latency_ms": cfg.network.latency_ms,
                              "ms_per_mb": cfg.network.ms_per_mb}
                             if cfg.network.enabled and distributed else None),
        "per_worker": per_worker(result),
        "per_shard": [{k: st.get(k) for k in ("version", "pulls", "pushes", "rows_touched",
                                              "samples_applied", "pid", "channel")}
                      for st in shards],
        "dynamic_tables": dynamic_tables([st.get("dynamic", {}) for st in shards]
                                         or [result.get("dynamic", {})]),
        "queue": {k: v for k, v in result.get("queue", {}).items() if k != "by_worker"},
        "failures": [e for e in record.events if "killed" in e["event"]],
        "recovery": recovery_summary(cfg, record, result, train_s),
        "stragglers_emulated": bool(cfg.faults.stragglers),
        "emulation": emulation_section(cfg, result, shards),
        "placement": record.placement,  # each actor's node when training started
        "data": str(cfg.data.path),
        "model": result.get("model_dir"),  # {"path", "bytes", "write_s"} of OUT/model
    }


def mode_sections(cfg, used: list[str], worker_stats: list | None, shards: list[dict],
                  waits: dict) -> dict:
    """Every mode's section (``Mode.summary_key``), None unless the run used the mode. The
    workers' figures (``mode_stats``, taken at the end) belong to the mode the run ended in."""
    sections = {m.summary_key: None for m in MODES.values() if m.summary_key}
    if worker_stats is not None and all(s is None for s in worker_stats):
        worker_stats = None
    for name in dict.fromkeys(used):  # each once, in order
        facts = MODES.get(name)
        if facts is None or not facts.summary_key:
            continue
        section = facts.summary(cfg, worker_stats if name == used[-1] else None, shards, waits)
        if section is not None or sections.get(facts.summary_key) is None:
            sections[facts.summary_key] = section
    return sections


def recovery_summary(cfg, record, result: dict, train_s: float) -> dict:
    """Checkpoints taken, what was written, the failures recovered from, and what it all cost:
    ``overhead`` = training time blocked by checkpoints (snapshots; a mode that pauses for
    them: the pause), without training after a failure (from the kill to the restarted shard
    serving; full recovery: to fresh workers training again) and lost (full recovery: the
    training since the checkpoint rolled back to, done again), each in seconds and as a
    fraction of training time. ``pls`` (partial recovery): for each shard failure, the samples
    trained between its restored checkpoint and its death, over the samples of the run, over
    the number of shards (each shard holds 1 / S of the model). ``lost_pushes``: pushes the
    workers (their last processes) had in flight to a shard that died. ``worker_restarts``:
    each time workers died and were restarted, the ranks that died and those restarted."""
    r = cfg.recovery
    blocked = sum(c["blocked_s"] for c in record.checkpoints)
    written = result.get("checkpoints_written") or []
    downtime = sum(x.get("downtime_s", 0.0) for x in record.recoveries)
    lost_work = sum(x.get("lost_work_s", 0.0) for x in record.recoveries)
    total = blocked + downtime + lost_work
    lost = sum(x["lost_samples"] for x in record.recoveries)
    pls = None
    if r.kind != "none" and record.samples:
        pls = lost / record.samples / cfg.cluster.ps_shards
    partial_saves = sum(1 for c in record.checkpoints for x in c["partial"] if x)
    downtimes = sorted(x["downtime_s"] for x in record.recoveries if "downtime_s" in x)
    final = result.get("final_checkpoint")
    return {"kind": None if r.kind == "none" else r.kind,
            "rows": r.rows if r.kind == "partial" else None,
            "pls": pls,
            "samples_redone": sum(x.get("samples_redone", 0) for x in record.recoveries),
            "lost_pushes": sum(s.get("lost_pushes", 0) for s in result.get("statuses", [])),
            "standby_shards": r.standbys,
            # each standby's take-over: when the directory was asked (a client saw the death),
            # when it served, and how long building the core and loading took
            "take_overs": result.get("take_overs") or [],
            "recoveries": record.recoveries,
            # from each failure to the first pull served again (docs/recovery.md)
            "downtime_per_failure": ({"p50_s": statistics.median(downtimes),
                                      "max_s": downtimes[-1], "n": len(downtimes)}
                                     if downtimes else None),
            "worker_restarts": [{k: e[k] for k in ("time_s", "dead", "restarted")}
                                for e in record.events if "restarted" in e],
            "interval_decision": record.interval_decision,
            "checkpoints": len(record.checkpoints),
            "partial_checkpoints": partial_saves,
            "overhead": {"checkpoint_blocked_s": blocked, "downtime_s": downtime,
                         "lost_work_s": lost_work, "total_s": total,
                         "frac": total / train_s if train_s else None},
            "checkpoint_overhead_frac": blocked / train_s if record.checkpoints and train_s
            else None,
            "checkpoint_blocked_s": blocked,
            # the shards' threads copying rows while calls were served: CPU a checkpoint takes
            # without holding training (summed over shards and rounds)
            "checkpoint_copy_s": sum(x or 0.0 for c in record.checkpoints
                                     for x in c.get("shard_copy_s", [])),
            # the shards' blocked time by part, summed over shards and rounds: the snapshot's
            # start (the row choice of a CPR priority), pushes held by the copy, a full queue
            "checkpoint_blocked_parts_s": {
                part: sum(p[part] for c in record.checkpoints
                          for p in c.get("shard_parts", []) if p)
                for part in ("start_s", "held_s", "save_s")},
            "checkpoint_dir": (str(result["checkpoint_dir"]) if result.get("checkpoint_dir")
                               else None),
            "final_job_checkpoint": final and final["job_sequence"],
            "written_per_shard": [len(w) for w in written],
            "write_s_mean": (sum(x["write_s"] for w in written for x in w)
                             / max(1, sum(len(w) for w in written))) if any(written) else None}


def dynamic_tables(per_store: list[dict]) -> dict | None:
    """Each dynamic table's counts (live rows, capacity, admitted, refused, evicted, expired,
    dropped gradients) summed over the stores that hold it; None without dynamic tables."""
    out: dict[str, dict] = {}
    for tables in per_store:
        for name, counts in tables.items():
            total = out.setdefault(name, dict.fromkeys(counts, 0))
            for key, n in counts.items():
                total[key] += n
    return out or None


def staleness(shard_stats: list[dict]) -> dict:
    """Mean, p99 and max staleness of every applied gradient, over all shards."""
    return distribution(merged_counts(st["staleness"] for st in shard_stats))


def emulation_section(cfg, result: dict, shards: list[dict]) -> dict | None:
    """The EMULATED cluster's label and how closely each process kept its emulated cores'
    pace (recsync/cluster/emulation.py), or None without emulation."""
    label = label_of(cfg)
    if label is None:
        return None
    e = cfg.emulation
    pacing = result.get("worker_pacing") or []
    ranks = result.get("worker_ranks") or range(len(pacing))  # an elastic run's: those that
    # left first, then those at the end
    workers = [worker_entry(rank, t) for rank, t in zip(ranks, pacing) if t is not None]
    return {"label": label, "cores_per_worker": e.cores_per_worker,
            "cores_per_shard": e.cores_per_shard, "cores_per_shadow": shadow_cores(cfg),
            "workers": workers,
            "shards": [shard_entry(i, st["pacing"], e.cores_per_shard)
                       for i, st in enumerate(shards) if st.get("pacing")]}


def per_worker(result: dict) -> list[dict]:
    """Each rank's steps and samples (the final statuses) and chunks (the queue's counts)."""
    by_worker = result.get("queue", {}).get("by_worker", {})
    return [{"rank": s["rank"], "steps": s["steps"], "samples": s["samples"],
             "chunks": by_worker.get(str(s["rank"]), {}).get("chunks", 0)}
            for s in result.get("statuses", [])]
