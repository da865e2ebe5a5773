"""The one watch loop of a distributed run: every half second it looks at the shards and the
workers, asks the policy what a failure means and carries that out, writes a metrics record,
and takes checkpoint rounds, switches, injected failures and evaluations (on a thread of their
own: distributed/evals.py) when they are due."""

from __future__ import annotations

import time
from dataclasses import replace

import ray

from recsync.distributed.actions import carry_out
from recsync.distributed.actors import ACTOR_GONE, SHARD_RESTART_WAIT_S
from recsync.distributed.evals import PeriodicEval
from recsync.distributed.faults import FaultInjector
from recsync.distributed.policy import Decision, Kind, decide
from recsync.distributed.status import DEAD, LEFT, PENDING, VACANT, ShardStatus, WorkerStatus
from recsync.distributed.switching import Switcher, log_switch, switch
from recsync.metrics.core import MetricsLog
from recsync.metrics.progress import progress
from recsync.metrics.stats import distribution, merged_counts

POLL_S = 0.5
WAIT_KEYS = ("pull_wait_s", "push_wait_s")


def watch(run, log: MetricsLog, end) -> tuple[list[WorkerStatus], dict]:
    """Poll until every worker is done and ``end(run)`` (distributed/ending.py finish) has
    ended the run; write metrics; recover, or raise RunFailed. Returns the workers' last
    statuses and what ``end`` returned (None from it: a recovery at the end has the workers
    training again, and the loop goes on)."""
    cfg, record = run.cfg, run.record
    t = cfg.train
    total = t.epochs * run.ds.rows("train")
    if t.max_steps:
        total = min(total, t.max_steps * t.batch_size * cfg.cluster.workers)
    bar = progress(total, "sample", f"train ({run.actors.mode})", cfg.output.progress,
                   smoothing=0.1)
    faults, switcher = FaultInjector(cfg), Switcher(cfg)
    evals, staleness = PeriodicEval(run, total), StalenessWindow(run.actors)
    recovering = cfg.recovery.kind != "none"
    last = time.perf_counter()
    try:
        while True:
            time.sleep(POLL_S)
            elapsed = time.time() - run.tallies.start_unix
            # a shard that Ray restarted: partial or full recovery (before the kills: the
            # versions just before an injected death are then known)
            settle(run, [], run.shard_statuses() if recovering else [], elapsed)
            faults.inject_due(run, elapsed, record.steps)  # (the last line's step)
            statuses = run.poll()
            if any(s.state in (DEAD, "error") for s in statuses):
                # is a shard gone too? (a restarting one is given time to come back)
                shards = run.shard_statuses(SHARD_RESTART_WAIT_S if recovering else 0.0)
                settle(run, statuses, shards, elapsed)
                continue
            if run.elastic is not None:  # joins, leaves, the target (elastic.py)
                before = (run.actors.live(), set(run.actors.pending))
                run.elastic.tend(run, statuses)
                if (run.actors.live(), set(run.actors.pending)) != before:
                    # as tend left them (started, retired), each interval since the first poll
                    statuses = [s.after(e) for s, e in zip(run.poll(), statuses)]
                run.elastic.log_count(run, statuses)
            now = time.perf_counter()
            done = (all(s.state == "done" for s in statuses) if run.elastic is None
                    else run.elastic.over(run, statuses))
            if done:  # training ended: waiting for the evaluation going on is not training
                record.stop()
                if run.elastic is not None:
                    run.elastic.close(run)
            finished = evals.collect(wait=done)  # before the line: its events go with it
            if finished is not None and run.best is not None:
                # may stop the run early (best.py), not one whose training has ended
                run.best.observe(finished, evals.kept, training=not done)
            elif run.best is not None and not done:
                run.best.drain()  # stopped early: a recovery may have restored the queue
            line = metrics_line(run, statuses, now - last)
            line["eval"], line["staleness"] = finished, staleness.since_last()
            bar.update(max(0, line["samples"] - record.samples))
            record.samples, record.steps = line["samples"], line["step"]
            run.tallies.observe(time.time(), line["samples"])
            last = now
            log.write(line)
            if line["loss"] is not None:
                bar.set_postfix(loss=f"{line['loss']:.4f}",
                                **({"workers": line["workers"]} if run.elastic else {}))
            if done:
                faults.inject_due(run, elapsed, line["step"])  # at the last step: as it ends
                ended = end(run)
                if ended is not None:
                    return statuses, ended
                record.train_end = None  # a recovery at the end: the workers train again
                continue
            evals.start_if_due(line["samples"], line["time_s"])
            run.rounds.if_due(elapsed, any(s.samples for s in statuses))
            due = switcher.due(run.actors.mode, statuses, elapsed, line["step"])
            if due and switch(run.actors, run.shard_watch, due[0]):
                log_switch(record, *due, elapsed)
                bar.set_description(f"train ({run.actors.mode})")
                switcher.switched()
    finally:
        evals.close()
        bar.close()


def settle(run, workers: list[WorkerStatus], shards: list[ShardStatus],
           elapsed_s: float, ending: str = "") -> Decision:
    """Ask the policy and carry out its decision; after a partial recovery (logged only) ask
    again about the rest. Returns the last decision. ``ending``: the moment of the run's end
    (policy.decide)."""
    while True:
        d = decide(run.facts, run.cfg, workers, shards, recovery=run.rounds.recovery,
                   restarts=run.tallies.restarts, ending=ending)
        carry_out(run, d, shards, elapsed_s)
        if d.kind is not Kind.RELOAD_SHARD:
            return d
        shards = [replace(s, restarted=False) if s.index in d.shards else s for s in shards]


class StalenessWindow:
    """The staleness of the gradients the shards applied since the previous metrics line
    ({mean, p99, max}, None if none); None too where a shard does not answer at once (the
    watch loop never waits for it)."""

    def __init__(self, actors):
        self.actors = actors
        self.before: dict[int, int] = {}

    def since_last(self) -> dict | None:
        refs = [s.staleness.remote() for s in self.actors.shards]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
        if len(ready) < len(refs):
            return None
        try:
            now = merged_counts(ray.get(refs))
        except ACTOR_GONE:
            return None
        # a shard restored from a checkpoint counts less than before: never below 0
        new = {k: n - self.before.get(k, 0) for k, n in now.items()
               if n > self.before.get(k, 0)}
        self.before = now
        return distribution(new) if new else None


def metrics_line(run, statuses: list[WorkerStatus], interval_s: float) -> dict:
    """One record of metrics.jsonl; modes that report waits add where a step's time went, per
    worker (and their totals go into the record for the summary)."""
    record = run.record
    samples = sum(s.samples for s in statuses)
    loss_n = sum(s.loss_samples for s in statuses)
    line = {
        "time_s": record.time_s(), "samples": samples,
        "step": max(s.steps for s in statuses),
        "loss": sum(s.loss_sum for s in statuses) / loss_n if loss_n else None,
        "samples_per_s": (samples - record.samples) / interval_s, "mode": run.actors.mode,
        "workers": sum(s.state not in (DEAD, LEFT, VACANT, PENDING) for s in statuses),
        "worker_step_s": [s.per_step("step_s") for s in statuses],
        "worker_compute_s": [s.per_step("compute_s") for s in statuses],
        "staleness": None, "events": record.unlogged_events(), "eval": None}
    if run.facts.reports_waits:
        for key in WAIT_KEYS:
            line[f"worker_{key}"] = [s.per_step(key) for s in statuses]
        for key in ("step_s", "compute_s", *WAIT_KEYS, "interval_steps"):
            record.waits[key] = record.waits.get(key, 0) + sum(getattr(s, key) for s in statuses)
    return line
