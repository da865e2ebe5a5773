"""The end of a distributed run, covered by recovery as its middle is.

When the workers are done the watch loop calls ``finish``. It first makes sure that every shard
is alive and that a restart is recovered (a shard killed in the last steps may still be
restarting: ``settle_at_end``), then makes the end's calls: the mode rule's ``end``, the final
checkpoint round, the shards' figures, the trained rows gathered, the final evaluation. A shard
or worker that dies before or during them is recovered as it would be mid-run (watch.settle
with the policy's ``ending``): partial recovery logs the restart (its updates since its
checkpoint are lost) and the end starts again; full recovery (or a lockstep mode's shards)
rolls everything back, a dead worker is restarted as its mode says, and then the workers train
again: ``finish`` returns None and the watch loop goes on. Where the mode cannot recover
(``recovery.kind = "none"``, a shard that does not come back) the run fails with one line
naming the shard and the moment.
"""

from __future__ import annotations

import time

import ray
import torch
from torch.nn.utils import vector_to_parameters

from recsync.distributed.actors import ACTOR_GONE, SHARD_RESTART_WAIT_S
from recsync.distributed.errors import RunFailed
from recsync.distributed.gather import gathered_model_state
from recsync.distributed.policy import Decision, Kind
from recsync.distributed.watch import settle
from recsync.metrics.evaluate import evaluate
from recsync.ps.client import PSClient
from recsync.run.local_run import LocalModel
from recsync.run.selection import say

END_TRIES = 3  # recoveries at the end before the run gives up (each needs a new failure)
AS_TRAINING_ENDED = "as training ended"
AT_THE_END = "at the end of training"
IN_FINAL_CHECKPOINT = "during the final checkpoint round"
IN_GATHER = "while the trained rows were gathered"
IN_FINAL_EVAL = "during the final evaluation"


class ShardSkipped(Exception):
    """The final checkpoint round skipped a shard (it was dying or restarting)."""


class Moment:
    """Where the end is (one of the moments above), for a failure's cause."""

    def __init__(self):
        self.now = AS_TRAINING_ENDED


def settle_at_end(run, moment: str) -> Decision:
    """The workers are done (or a call of the end met a dead actor at ``moment``): every shard
    alive, a restarted one recovered, a dead worker restarted, as mid-run (a shard that is
    restarting is waited for). Returns the last decision: CONTINUE where the workers are
    still done. Raises RunFailed where the mode cannot recover."""
    recovering = run.cfg.recovery.kind != "none"
    workers = run.poll()
    shards = run.shard_statuses(SHARD_RESTART_WAIT_S if recovering else 0.0)
    return settle(run, workers, shards, time.time() - run.tallies.start_unix, ending=moment)


def finish(run, end=None) -> dict | None:
    """After the workers are done: the end's calls (``end``: default ``end_calls``), each
    failure recovered and the end started again (``END_TRIES`` at most). Returns what the
    summary needs, or None where a recovery has the workers training again."""
    end = end or end_calls
    if settle_at_end(run, AS_TRAINING_ENDED).kind is not Kind.CONTINUE:
        return None
    for attempt in range(END_TRIES + 1):
        moment, recoveries = Moment(), len(run.record.recoveries)
        try:
            out = end(run, moment)
            break
        except (*ACTOR_GONE, ShardSkipped) as e:
            cause = f"{type(e).__name__} {moment.now}: {_first_line(e)}"
            if attempt == END_TRIES:
                raise RunFailed(f"the end of the run failed {END_TRIES + 1} times; the "
                                f"last: {cause}") from e
            if settle_at_end(run, moment.now).kind is not Kind.CONTINUE:
                return None
            if len(run.record.recoveries) == recoveries:  # nothing was down: not a death
                raise RunFailed(cause) from e
    return {**out, **after_end(run)}


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0][:200] if lines else ""


def end_calls(run, moment: Moment) -> dict:
    """The end's calls to the shards (and the workers' figures): what the shards still hold
    applied, the final job checkpoint (the trained model), the figures, and the trained model
    gathered and evaluated. Every call may be made again after a recovery. ``moment`` follows
    where it is."""
    actors, model = run.actors, run.model
    moment.now = AT_THE_END
    actors.shard_call("end")  # e.g. the last, partial global batch: nothing left unapplied
    final_checkpoint = None
    if actors.checkpoint_dir is not None:  # the trained model, and a run that can be resumed
        moment.now = IN_FINAL_CHECKPOINT
        final_checkpoint = run.rounds.take(final=True)
        if final_checkpoint is None or final_checkpoint["job_sequence"] is None:
            raise ShardSkipped(f"shard(s) skipped: sequences "
                               f"{final_checkpoint and final_checkpoint['sequences']}")
    moment.now = AT_THE_END
    shard_stats = ray.get([s.stats.remote() for s in actors.shards])
    written = ray.get([s.checkpoints_written.remote() for s in actors.shards])
    live = [actors.workers[r] for r in actors.live()]
    # with the figures of the workers that left an elastic run
    mode_stats = [g["mode_stats"] for g in actors.gone] + ray.get(
        [w.mode_stats.remote() for w in live])
    pacing = [g["pacing"] for g in actors.gone] + ray.get([w.pacing.remote() for w in live])
    ranks = [g["rank"] for g in actors.gone] + actors.live()
    final_dense = ray.get(actors.shards[0].call.remote("model_dense"))
    worker_state = None
    if final_dense is None:  # the workers hold it (all replicas alike now, or the first's)
        worker_state = actors.dense_state(actors.live()[0], timeout=None)
        final_dense = worker_state["params"]
    with torch.no_grad():
        vector_to_parameters(torch.tensor(final_dense), list(model.dense_model.parameters()))
    moment.now = IN_GATHER
    model_state = (gathered_model_state(run.cfg, actors.shards, model, worker_state)
                   if run.cfg.output.save_model else None)
    moment.now = IN_FINAL_EVAL
    trained = LocalModel(model.dense_model, PSClient(actors.shards, model.plan), None)
    scored = trained
    best = run.best.at_end(trained) if run.best is not None else None
    if best is not None:  # an earlier evaluation's model is the better one: best.py
        say(run.best.selection.kept_line())
        scored = run.best.best_model(best, model.dense_model)
        model_state = best if run.cfg.output.save_model else None
    final_eval = evaluate(scored.dense, scored.lookup, run.ds, run.ds.rows("eval"),
                          run.cfg.train.eval_batch_size,
                          keep_scores=run.cfg.output.save_predictions)
    return {"eval": final_eval, "shards": shard_stats, "mode_stats": mode_stats,
            "worker_pacing": pacing, "worker_ranks": ranks, "checkpoints_written": written,
            "checkpoint_dir": actors.checkpoint_dir, "final_checkpoint": final_checkpoint,
            "model_state": model_state,
            "model": trained}  # its lookup serves the trained rows while the session lasts


def after_end(run) -> dict:
    """What the end's calls left: the chunks each worker took, the take-overs and the queue's
    figures; the checkpoint writer closed."""
    actors, tallies = run.actors, run.tallies
    for r in actors.live():
        tallies.took(r, ray.get(actors.workers[r].taken_chunks.remote()))
    if actors.checkpoint_dir is not None:
        run.rounds.close()
    take_overs = ray.get(actors.directory.report.remote()) if actors.directory else []
    start_unix = tallies.start_unix
    return {"take_overs": [{**t, "asked_s": t["asked_unix"] - start_unix,
                            "ready_s": t["ready_unix"] - start_unix} for t in take_overs],
            "queue": ray.get(actors.queue.summary.remote()), "taken": tallies.taken}
