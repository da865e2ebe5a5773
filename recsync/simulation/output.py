"""What a simulated run writes and says: the run's summary.json (run/summary.py, built the same
way) on the simulated clock, labelled SIMULATED, with the real time this process took beside
it, and the console's lines."""

from __future__ import annotations

import statistics
import time

from recsync.run.record import RunRecord
from recsync.run.summary import build_summary

LABEL = "SIMULATED"
CLOCK_NOTE = ("SIMULATED: one process ran every worker's real arithmetic in the order of a "
              "simulated clock; wall_s, train_s, samples_per_s and every time_s are simulated "
              "seconds of the modelled cluster; real_wall_s is this process's own time")


class SimRecord(RunRecord):
    """A run's record whose clock is the simulated one: training starts at simulated 0, takes
    no start-up, and ends when the last worker stops. The real times stay in ``start`` (the
    process's perf_counter) for ``real_wall_s``."""

    def __init__(self, clock, **kwargs):
        super().__init__(**kwargs)
        self.clock = clock
        self.sim_end_s: float | None = None

    def _sim_now(self) -> float:
        return self.clock.now if self.sim_end_s is None else self.sim_end_s

    def time_s(self) -> float:
        return self.clock.now

    def train_s(self) -> float:
        return self._sim_now()

    def elapsed(self) -> float:
        return self._sim_now()

    def startup_s(self) -> float | None:
        return 0.0

    def real_wall_s(self) -> float:
        return time.perf_counter() - self.start

    def real_train_s(self) -> float:
        end = time.perf_counter() if self.train_end is None else self.train_end
        return end - (self.train_start or self.start)


def simulated_summary(cfg, ds, record: SimRecord, cluster, final: dict, timing,
                      measured: list[str], ended: int) -> dict:
    """summary.json of a simulated run: build_summary's fields (simulated times) plus
    ``simulated``: the label, the real times, the model of time and what it gave."""
    workers = cluster.workers
    result = {"eval": final, "shards": [core.stats() for core in cluster.cores],
              "mode_stats": [w.mode.stats() for w in workers],
              "queue": cluster.queue.summary(),
              "statuses": [{"rank": w.rank, "steps": w.steps, "samples": w.samples}
                           for w in workers]}
    summary = build_summary(cfg, ds, record, result, "completed", None)
    factors = cluster.speeds.initial()
    sim_s = record.train_s()
    summary["label"] = LABEL
    summary["simulated"] = {
        "label": CLOCK_NOTE,
        "simulated_train_s": sim_s,
        "real_wall_s": record.real_wall_s(),
        "real_train_s": record.real_train_s(),
        "real_eval_s": record.eval_total_s,
        "timing": timing.as_dict(),
        "measured_here": measured,  # the fields of timing measured on this machine (else given)
        # this run's own: the worker threads' real CPU per step before and after the compute
        # (medians; what pull_side_s and push_side_s model)
        "real_pull_side_s_median": statistics.median(
            [p for w in workers for p, _ in w.real_sides_s] or [0.0]),
        "real_push_side_s_median": statistics.median(
            [q for w in workers for _, q in w.real_sides_s] or [0.0]),
        "speed_factors": {"min": min(factors), "median": statistics.median(factors),
                          "max": max(factors),
                          "slower_than_1": sum(1 for f in factors if f > 1.0)},
        "events": cluster.clock.events_run,
        "applied_at_end": ended,  # gradients the rules still held when training ended
        "shard_busy_frac": [s.busy_s / sim_s if sim_s else None for s in cluster.shards],
        "shard_busy_s": [s.busy_s for s in cluster.shards],
        "shard_calls": [s.calls for s in cluster.shards],
        "all_reduce_rounds": cluster.group.rounds if cluster.group else None,
        "all_reduce_wait_s": cluster.group.waited_s if cluster.group else None,
        "per_worker": [{"rank": w.rank, "factor_at_start": factors[w.rank],
                        "steps": w.steps, "finished_s": w.finished_at,
                        "pull_s": w.pull_s()} for w in workers],
    }
    return summary


def console_lines(summary: dict, out) -> list[str]:
    """What `recsync simulate` prints at the end: every figure labelled simulated or real."""
    s, ev = summary["simulated"], summary["eval"]
    lines = [f"SIMULATED {summary['mode']}: {summary['workers']} workers, "
             f"{summary['ps_shards']} PS shards; {summary['samples']:,} samples, "
             f"{summary['steps']:,} steps (the most of any worker), in "
             f"{s['simulated_train_s']:.2f} simulated s = "
             f"{_num(summary['samples_per_s'], ',.0f')} simulated samples/s"]
    if ev.get("auc") is not None:
        line = f"eval AUC {ev['auc']:.4f}, logloss {ev['logloss']:.4f} on {ev['rows']:,} rows"
        if ev.get("bayes_auc") is not None:
            line += f" (Bayes-optimal AUC {ev['bayes_auc']:.4f})"
        lines.append(line + " (real arithmetic on the simulated order of updates)")
    st = summary.get("staleness") or {}
    if st.get("mean") is not None:
        lines.append(f"staleness of applied gradients (from the simulated event order): mean "
                     f"{st['mean']:.2f}, p99 {st['p99']}, max {st['max']}")
    t = s["timing"]
    lines.append(f"model of time: compute {t['compute_s'] * 1e3:.2f} ms per step ("
                 f"{_source(s, 'compute_s')}) + the worker's own {t['pull_side_s'] * 1e3:.2f} "
                 f"ms before and {t['push_side_s'] * 1e3:.2f} ms after it ("
                 f"{_source(s, 'pull_side_s')}), x speed factors "
                 f"{s['speed_factors']['min']:.2f}-{s['speed_factors']['max']:.2f}; latency "
                 f"{t['latency_s'] * 1e3:.3f} ms; shard {t['pull_s_per_row'] * 1e6:.3f} / "
                 f"{t['push_s_per_row'] * 1e6:.3f} us per pulled / pushed row")
    lines.append(f"real wall time of this process: {s['real_wall_s']:.1f} s (training "
                 f"{s['real_train_s']:.1f} s, of it evaluations {s['real_eval_s']:.1f} s)")
    lines.append(f"outputs: {out}/summary.json, metrics.jsonl, config.toml, training.png "
                 f"(all labelled SIMULATED)")
    return lines


def _source(s: dict, name: str) -> str:
    return "measured here" if name in s["measured_here"] else "given"


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)
