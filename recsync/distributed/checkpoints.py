"""Checkpoint rounds (``recovery``): every shard writes its own checkpoint, and the driver a job
checkpoint naming them with the data position and, where the workers hold them, the dense
parameters (checkpoint/job.py). A mode that ``pauses_for_checkpoint`` pauses the workers after
a step for it, so that replicas, shards and data position agree. A round at the start and one
at the end (the trained model) make every run resumable: ``recsync train --resume DIR`` starts
from the newest round.

The interval is configured (``checkpoint_every_s``) or chosen from the first round's measured
cost and ``mtbf_s`` (checkpoint/interval.py), and chosen again as rounds and failures are seen
(``CheckpointRounds.rechoose``)."""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

import ray

from recsync.checkpoint import job
from recsync.checkpoint.interval import choose
from recsync.checkpoint.writer import CheckpointWriter
from recsync.distributed.policy import recovery_kind

# The interval is chosen again from the median blocked time of this many recent rounds, and a
# round (not a failure) records a new choice only where the interval moves by more than this.
COST_ROUNDS, RECHOOSE_MOVE = 5, 0.1
# A shard that dies loses at most two checkpoints not yet on disk (one being written, one
# waiting: writer.py), which the newest job checkpoints may name: keep two more of those.
JOB_KEEP_EXTRA = 2


def completed_counts(counts: list[dict], by_worker: dict, batch_size: int) -> list[dict]:
    """Each rank's counts ({samples, steps}) as a job checkpoint taken without pausing the
    workers records them: the chunks the queue saw it complete (``by_worker``, the queue
    state's), as a chunk leased at that moment is trained again from its start after a
    rollback; its steps less those of the samples not completed."""
    out = []
    for r, c in enumerate(counts):
        completed = by_worker.get(str(r), {}).get("samples", 0)
        out.append({"samples": completed,
                    "steps": c["steps"] - round((c["samples"] - completed) / batch_size)})
    return out


class CheckpointRounds:
    """The checkpoint rounds of one run: when they are due, taking one, and what they cost (in
    the run's ``record``); and the recovery in force (``recovery``: "auto" chooses it at the
    first round). What it uses of the run: ``actors`` (actors.RunActors), ``tallies``
    (the counts and clock), ``watch`` (shard_watch.ShardWatch: which shard restarted) and
    ``model`` (driver_model.DriverModel: the dense state before the workers start)."""

    def __init__(self, cfg, record, actors, tallies, watch, model):
        self.cfg, self.record, self.actors = cfg, record, actors
        self.tallies, self.watch, self.model = tallies, watch, model
        self.recovery = recovery_kind(cfg)  # the recovery in force ("auto": chosen later)
        r = cfg.recovery
        self.writer = (None if actors.checkpoint_dir is None else
                       CheckpointWriter(job.job_dir(actors.checkpoint_dir),
                                        keep=r.keep + JOB_KEEP_EXTRA))
        # the shards' sequence numbers of the job checkpoints kept, oldest first: the shards
        # keep those checkpoints
        self.named: deque = deque(maxlen=r.keep + JOB_KEEP_EXTRA)
        self.every = r.checkpoint_every_s
        self.choosing = not self.every and r.mtbf_s > 0  # the first round measures the cost
        self.next_s = self.every if self.every else (0.0 if self.choosing else math.inf)
        self.failures = 0
        self.costs = (0.0, 0.0)  # measured: (save cost of recent rounds, first write), in s

    def if_due(self, elapsed_s: float, trained: bool) -> None:
        """A round if one is due (``trained``: the workers have trained some samples)."""
        if elapsed_s < self.next_s or not trained:
            return
        ckpt = self.take()
        if ckpt is None:
            return
        self.log(ckpt, elapsed_s)
        if self.choosing:
            self.every = self.choose_interval(ckpt, elapsed_s)
            self.choosing = False
        else:
            self.rechoose(elapsed_s, after_failure=False)
        self.next_s = elapsed_s + self.every

    def take(self, final: bool = False, resumed: dict | None = None) -> dict | None:
        """A checkpoint round: every shard's own checkpoint and, if every shard took one, a job
        checkpoint naming them. A mode that pauses for it pauses the workers after a step
        first (None if it cannot: a worker finished); other modes do not pause, and a chunk
        leased at that moment is trained again from its start after a rollback. ``final``:
        the workers are done.

        Returns each shard's sequence number and version (None for a shard that is restarting
        with recovery on: it is skipped this time), the job checkpoint's sequence, and how
        long training was blocked: the pause, else the slowest shard's snapshot (calls to it
        wait). ``resumed``: a rollback onto other shards, before the workers start: the job
        checkpoint's data position, counts and dense state ({"queue", "done", "dense"}) with
        the new shards' checkpoints."""
        actors = self.actors
        begin = time.perf_counter()
        started = bool(actors.live())
        paused = actors.facts.pauses_for_checkpoint and not final and started
        if paused and not actors.pause_all("checkpoint", self.watch):
            return None
        try:
            positions = {}
            if resumed is not None:
                queue_state, counts = resumed["queue"], resumed["done"]
            elif paused:
                for p in ray.get([actors.workers[r].positions.remote() for r in actors.live()]):
                    positions.update(p)
            if resumed is None:
                counts = ([{"samples": s.samples, "steps": s.steps}
                           for s in actors.poll(self.tallies)]
                          if started else [{"samples": 0, "steps": 0} for _ in actors.workers])
                # the data position before the shards' state: what completes in between is
                # trained again after a rollback, never skipped
                queue_state = ray.get(actors.queue.state.remote(positions))
            if not paused and resumed is None:  # leased chunks start again
                counts = completed_counts(counts, queue_state["by_worker"],
                                          self.cfg.train.batch_size)
            # keep what the job checkpoints kept after this round name (this one drops the
            # oldest once the driver keeps as many as it may)
            named = list(self.named)[1 - self.named.maxlen:]
            floor = [min(r[i] for r in named) if named else None
                     for i in range(len(actors.shards))]
            refs = [s.checkpoint.remote(floor[i]) for i, s in enumerate(actors.shards)]
            done = []
            for ref in refs:
                try:
                    done.append(ray.get(ref, timeout=120))
                except ray.exceptions.RayActorError:
                    if self.cfg.recovery.kind == "none":
                        raise
                    done.append(None)
            dense = resumed["dense"] if resumed is not None else self._dense_for_job(started)
        finally:
            if paused:
                actors.resume_all()
        taken = [d for d in done if d is not None]
        sequences = [d and d["sequence"] for d in done]
        # A shard that Ray restarted since the driver last looked answers too (calls wait for
        # the restart), with the state it reloaded: such a round mixes old and new states, so
        # it makes no job checkpoint (full recovery rolls back to the one before).
        restarted = [i for i, d in enumerate(done)
                     if d is not None and self.watch.moved(i, d["pid"])]
        job_sequence = None
        if len(taken) == len(done) and not restarted:
            self.named.append(sequences)
            job_sequence = self.writer.save(job.dense_arrays(dense), {
                "final": final, "mode": actors.mode, "shard_sequences": sequences,
                "step_index": (max(d["version"] for d in done) if actors.facts.lockstep
                               else 0),
                "queue": queue_state, "unix": time.time(),
                "done": [{"samples": c["samples"], "steps": c["steps"]} for c in counts],
                "samples": sum(c["samples"] for c in counts),
                "steps": max(c["steps"] for c in counts),
                "train_s": time.time() - self.tallies.start_unix,
                "dense_param_groups": job.dense_meta(dense),
                "config": self.cfg.model_dump(mode="json")})
        blocked = (time.perf_counter() - begin if paused
                   else max((d["blocked_s"] for d in taken), default=0.0))
        return {"sequences": sequences, "versions": [d and d["version"] for d in done],
                "job_sequence": job_sequence, "blocked_s": blocked,
                "shard_blocked_s": [d and d["blocked_s"] for d in done],
                "shard_copy_s": [d and d["copy_s"] for d in done],
                # what each shard's blocked_s is made of (ps/shard.py's checkpoint)
                "shard_parts": [d and {k: d[k] for k in ("start_s", "held_s", "save_s")}
                                for d in done],
                "partial": [d and d["partial"] for d in done],
                "rows": [d and d["rows"] for d in done]}

    def _dense_for_job(self, started: bool) -> dict | None:
        """The dense state a job checkpoint holds where the workers hold it (flat layout;
        None where PS shard 0 holds it: its checkpoint has it). Before the workers start: the
        initial model."""
        if self.actors.facts.dense_on_ps:
            return None  # no call to a worker that holds nothing
        if not started:
            return (self.model.start_dense(self.cfg, dense_on_ps=False)
                    or {"params": self.model.initial_dense(), "optimizer": None})
        return self.actors.dense_state(self.actors.live()[0])

    def log(self, ckpt: dict, elapsed_s: float, training: bool = True) -> None:
        """Record a round; ``training``: whether workers were training (else it blocked
        nothing: the round before they start)."""
        record = self.record
        if not training:
            ckpt = {**ckpt, "blocked_s": 0.0}
        record.checkpoints.append({"time_s": elapsed_s, "samples": record.samples, **ckpt})
        partial = [i for i, x in enumerate(ckpt["partial"]) if x]
        record.event(elapsed_s, (
            f"checkpoint: shards' sequence numbers {ckpt['sequences']}"
            + (f" (partial: shard(s) {partial})" if partial else "")
            + f", versions {ckpt['versions']}, job checkpoint {ckpt['job_sequence']}, training "
            f"blocked {ckpt['blocked_s'] * 1e3:.0f} ms"))

    def choose_interval(self, ckpt: dict, elapsed_s: float) -> float:
        """The checkpoint interval from the measured save cost and recovery.mtbf_s; the inputs
        and the decision go into the events and the summary. The save cost is what the round
        ``ckpt`` blocked training; its write to disk (waited for here, once, while the shards
        go on serving) bounds the interval from below, as a writer slower than the interval
        would block every save."""
        record = self.record
        write_s = 0.0
        for ref in [s.checkpoints_written.remote() for s in self.actors.shards]:
            try:
                written = ray.get(ref, timeout=300)
            except ray.exceptions.RayActorError:  # restarting (recovery on)
                continue
            write_s = max([write_s] + [w["write_s"] for w in written[-1:]])
        self.costs = (ckpt["blocked_s"], write_s)
        r = self.cfg.recovery
        if r.kind == "auto":  # the kind with the lower expected overhead, from now on
            self.recovery = choose(ckpt["blocked_s"], r.mtbf_s, self.cfg.cluster.ps_shards,
                                   r.pls_target).kind
        interval, decision, text = self._decide(r.mtbf_s)
        record.interval_decision = {**decision.as_dict(), "used_kind": self.recovery,
                                    "used_interval_s": interval, "write_s": write_s,
                                    "rechosen": []}
        record.event(elapsed_s, text)
        print(text, flush=True)
        return interval

    def failed(self, elapsed_s: float) -> None:
        """A failure was recovered: count it and choose the interval again (``rechoose``)."""
        self.failures += 1
        self.rechoose(elapsed_s, after_failure=True)

    def rechoose(self, elapsed_s: float, after_failure: bool) -> None:
        """Where the interval was chosen from recovery.mtbf_s, choose it again from what the
        run has seen: the MTBF counts ``mtbf_s`` as one failure interval observed before the
        run, F = (mtbf_s + elapsed) / (1 + failures), and is taken at every round as well as
        at each failure (taken only at failures it would be biased low: the time since the
        last one counts too); the save cost is the median blocked time of the last
        ``COST_ROUNDS`` rounds (a snapshot grows with the rows touched). A round records a new
        choice only where the interval moved by more than ``RECHOOSE_MOVE``."""
        decided = self.record.interval_decision
        if decided is None:
            return
        recent = [c["blocked_s"] for c in self.record.checkpoints if c["samples"] > 0]
        if recent:
            self.costs = (statistics.median(recent[-COST_ROUNDS:]), self.costs[1])
        mtbf = (self.cfg.recovery.mtbf_s + elapsed_s) / (1 + self.failures)
        every, decision, text = self._decide(mtbf)
        if not after_failure and abs(every - self.every) <= RECHOOSE_MOVE * self.every:
            return
        self.every = every
        text = (f"{self.failures} failure(s) in {elapsed_s:.1f} s and recovery.mtbf_s "
                f"{self.cfg.recovery.mtbf_s:g} s: MTBF taken as {mtbf:.1f} s; " + text)
        decided["rechosen"].append({"time_s": elapsed_s, "failures": self.failures,
                                    "mtbf_s": mtbf, "save_cost_s": self.costs[0],
                                    "interval_s": self.every, "after_failure": after_failure})
        self.record.event(elapsed_s, text)
        print(text, flush=True)

    def _decide(self, mtbf_s: float):
        """(interval, decision, text) for the recovery in force, from the measured costs."""
        r = self.cfg.recovery
        save_s, write_s = self.costs
        decision = choose(save_s, mtbf_s, self.cfg.cluster.ps_shards, r.pls_target)
        text = decision.text()
        used = self.recovery
        interval = decision.full_interval_s if used == "full" else decision.partial_interval_s
        if used != decision.kind and r.kind != "auto":
            text += (f"; recovery.kind = \"{r.kind}\" is configured, so {used} recovery goes "
                     f"on at its own interval ({interval:.1f} s)")
        if interval < write_s:
            interval = write_s
            text += f"; the interval is raised to the measured write time {write_s:.2f} s"
        return interval, decision, text

    def flush(self) -> None:
        """Every job checkpoint taken is on disk."""
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
