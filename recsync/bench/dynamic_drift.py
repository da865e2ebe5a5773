"""Scenario `dynamic`'s drifting stream: dynamic tables whose capacity is below the ids seen,
against one that holds every id, and the training process's memory while they train.

The stream (dynamic_data.derive with ``segments``) is read in order (``data.shuffle = false``),
so its ids arrive segment by segment and the eval split is the last segment's: the final eval
is the AUC of the last window. Each run is ``recsync train`` in a process of its own (so that
memory freed by an earlier run cannot be reused by a later one and hide its growth), with a
``ProcessSampler`` thread reading, every ``INTERVAL_S``, that process's resident memory
(``VmRSS``, and ``RssAnon``: without the memory-mapped data set's file pages, which grow with
the rows read whatever the tables do) and the samples done so far (the last line of its
metrics.jsonl, written every 5 steps). Memory "once full": the tables are full at the train
row where the rows they hold reach ``FULL_SHARE`` of what they hold at the end (from the data:
with ``admit_after = 1`` and no evaluation during the run, every id seen is admitted, so table
t holds min(distinct ids seen so far, capacity)). Not 100%: the large tables fill within the
first segment, while tables with fewer ids than the capacity go on taking each new segment's
ids to the last one (``rows_after`` counts them: the growth the tables themselves explain). The
growth once full is the median anonymous RSS over the last ``WINDOW`` of training less its
median over the ``WINDOW`` from that row (medians: one sample may fall inside a step's
transient tensors).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from recsync.api import override
from recsync.bench import overhead as ov
from recsync.bench import seeds as sd
from recsync.config import RunConfig
from recsync.metrics.core import read_jsonl

INTERVAL_S = 0.2
FULL_SHARE = 0.8  # of the rows the tables hold at the end
WINDOW = 0.1  # of the training samples, for each median of memory
MB = 2**20


class ProcessSampler:
    """Context manager: (perf_counter time, samples done, VmRSS bytes, RssAnon bytes) of
    process ``pid`` training into ``run_dir``, every ``interval_s`` in a daemon thread, until
    ``__exit__`` or the process is gone."""

    def __init__(self, pid: int, run_dir: Path, interval_s: float = INTERVAL_S):
        self.pid, self.metrics, self.interval_s = pid, run_dir / "metrics.jsonl", interval_s
        self.series: list[tuple[float, int, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-rss", daemon=True)

    def sample(self) -> bool:
        fields = {}
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in ("VmRSS", "RssAnon"):
                        fields[key] = int(value.split()[0]) * 1024  # kB
        except OSError:
            return False  # the process is gone
        if len(fields) == 2:  # a zombie has no memory lines
            self.series.append((time.perf_counter(), self._samples(), fields["VmRSS"],
                                fields["RssAnon"]))
        return True

    def _samples(self) -> int:
        try:
            lines = self.metrics.read_bytes().splitlines()
        except OSError:
            return 0
        return json.loads(lines[-1])["samples"] if lines else 0

    def _loop(self) -> None:
        while not self._stop.is_set() and self.sample():
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def full_row(first_seen: list, capacity: int, share: float = FULL_SHARE) -> int | None:
    """The train row at which the tables hold ``share`` of the rows they hold at the end, table
    t holding min(ids seen so far, ``capacity``) (``first_seen``: dynamic_data.id_counts');
    None if no table outgrows the capacity."""
    if not any(len(f) > capacity for f in first_seen):
        return None
    held = np.sort(np.concatenate([f[:capacity] for f in first_seen]))  # when each row came
    return int(held[math.ceil(share * len(held)) - 1])


def rows_after(first_seen: list, row: int, capacity: int) -> int:
    """Rows the tables take after train row ``row``: at the end, table t holds min(its
    distinct ids, ``capacity``); at ``row``, min(those seen before it, ``capacity``)."""
    return sum(min(len(f), capacity) - min(int(np.searchsorted(f, row)), capacity)
               for f in first_seen)


def memory_over_run(series: list[tuple], total: int, full_at: int | None,
                    fractions=(0.0, 0.25, 0.5, 0.75, 1.0)) -> dict:
    """RSS and anonymous RSS (MB), medians over ``WINDOW`` of the ``total`` training samples:
    ending at each of ``fractions`` of them (starting, for 0), and the growth once full (module
    docstring). ``series``: ProcessSampler's."""
    training = [s for s in series if s[1] > 0]
    if not training:
        raise RuntimeError("no memory sample during training: the run was too short to sample")
    done = next((i for i, s in enumerate(training) if s[1] >= total), len(training) - 1)
    training = training[:done + 1]  # after training's last record: the final evaluation
    width = WINDOW * total

    def median(lo: float, hi: float) -> dict:
        inside = [s for s in training if lo <= s[1] <= hi]
        if not inside:  # records sparser than the window: the first sample past it
            inside = [next((s for s in training if s[1] >= lo), training[-1])]
        return {"rss": statistics.median(s[2] for s in inside) / MB,
                "anon": statistics.median(s[3] for s in inside) / MB}

    points = {f"{round(100 * f)}%": median(*((0, width) if f == 0 else
                                              (f * total - width, f * total)))
              for f in fractions}
    end = points[f"{round(100 * fractions[-1])}%"]
    out = {"at_training_fraction_mb": points, "full_at_row": full_at, "end_mb": end,
           "peak_anon_mb": max(s[3] for s in series) / MB, "window": WINDOW,
           "samples": len(series), "interval_s": INTERVAL_S}
    if full_at is not None and full_at < total:
        full = median(full_at, full_at + width)
        out["growth_after_full_mb"] = {k: end[k] - full[k] for k in end}
        out["full_at_fraction"] = full_at / total
    return out


def train_in_process(cfg: RunConfig, out_dir: Path, full_at: int | None) -> dict:
    """``recsync train`` of ``cfg`` in a new process, sampled; its summary, its samples/s after
    the warm-up (overhead.steady_rate) and its memory over the run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.in.toml").write_text(cfg.to_toml())
    run_dir = out_dir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier run's metrics.jsonl would be read
    proc = subprocess.Popen([sys.executable, "-m", "recsync", "train", "--config",
                             str(out_dir / "config.in.toml"), "--out", str(run_dir),
                             "--overwrite"], stdout=subprocess.DEVNULL)
    with ProcessSampler(proc.pid, run_dir) as sampler:
        if proc.wait() != 0:
            raise RuntimeError(f"the drift run in {run_dir} failed (exit {proc.returncode})")
    summary = json.loads((run_dir / "summary.json").read_text())
    rate = ov.steady_rate(read_jsonl(run_dir / "metrics.jsonl"),
                          ov.WARMUP_STEPS * cfg.train.batch_size)
    return {**summary, "summary_samples_per_s": summary["samples_per_s"], **rate,
            "out_dir": str(run_dir), "cpu": None,
            "memory": {"peak_total_rss": max(s[2] for s in sampler.series),
                       "run_s": summary["wall_s"]},
            "memory_over_run": memory_over_run(sampler.series, summary["samples"], full_at),
            "memory_series": [(round(t - sampler.series[0][0], 2), n, r, a)
                              for t, n, r, a in sampler.series]}


def drift_runs(configs: dict[str, RunConfig], out: Path, seeds: int,
               full_at: int | None) -> dict[str, list[dict]]:
    """Every arm of ``configs`` once per seed (arms interleaved within a seed, as
    seeds.seeded_runs), each in a process of its own (``train_in_process``)."""
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for s in range(seeds):
        for name, cfg in configs.items():
            print(f"drift seed {s + 1}/{seeds}: {name} ...", flush=True)
            r = train_in_process(override(cfg, **{"train.seed": s}),
                                 out / "arms" / name / f"seed{s}", full_at)
            live = sum(t["live"] for t in (r.get("dynamic_tables") or {}).values())
            mem = r["memory_over_run"]
            growth = mem.get("growth_after_full_mb", {}).get("anon")
            print(f"  {r['samples_per_s']:,.0f} samples/s after warm-up; eval AUC "
                  f"{r['eval']['auc']:.4f}; live rows at the end {live:,}; anonymous RSS "
                  f"{mem['end_mb']['anon']:,.0f} MB"
                  + (f", {growth:+,.1f} MB since the tables filled" if growth is not None
                     else ""), flush=True)
            runs[name].append(r)
    return runs


def drift_entry(results: list[dict]) -> dict:
    """``seeds.seeded_entry`` plus the live rows and the memory of every seed."""
    entry = sd.seeded_entry(results)
    entry["live_rows_seeds"] = [sum(t["live"] for t in (r.get("dynamic_tables") or {}).values())
                                for r in results]
    entry["memory_over_run_seeds"] = [r["memory_over_run"] for r in results]
    growth = [r["memory_over_run"].get("growth_after_full_mb") for r in results]
    entry["anon_growth_after_full_mb_seeds"] = [g["anon"] if g else None for g in growth]
    return entry
