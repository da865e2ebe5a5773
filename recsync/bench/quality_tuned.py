"""Scenario `quality`'s tuned arm: `recsync.tune` on each sample, then the chosen config
trained with the scenario's seeds (issue 35, build item 5).

Per sample:
1. ``recsync.tune`` over ``SPACE`` (below) with ``trials()`` trials (``TRIALS`` = 16 unless
   ``$RECSYNC_QUALITY_TUNE_TRIALS`` says otherwise; 0 turns the arm off), the base config being
   the scenario's early stopping arm's (train.validation 0.2, the slice the baselines choose
   on; train.patience 4 evaluations; train.epochs 10 as a maximum; 4 evaluations an epoch),
   ASHA on the validation log loss with a grace of ``GRACE_EVALS`` evaluations (one epoch:
   no trial is stopped before it has seen every fitting row once), draws seeded by ``SEED``.
2. The chosen config (best.toml: the lowest validation log loss, the eval split plays no
   part) trained with seeds 0, 1, 2 exactly as the scenario's other recsync arms
   (``quality._recsync_arm``); the arm is their mean eval AUC and log loss.

CPU seconds of the arm: the search's plus the seeds'. Ray Tune runs the trials in Ray's worker
processes, which ``getrusage`` does not see while they live, so the search is measured with
``TreeCPU``: this process's own CPU (RUSAGE_SELF) plus the user + system CPU of every process
descended from it (Ray's GCS, raylet, dashboard, workers and their trials), read from /proc
every ``POLL_S`` seconds, each process counted at the last reading before it ended. What a
process spends after the last reading before it exits (at most ``POLL_S`` of it), or a
process that lives less than ``POLL_S`` entirely, is missed: the figure is a lower bound,
close to the whole (Ray's idle daemons included: a user's search pays for them too).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path

TRIALS = 16
TRIALS_ENV = "RECSYNC_QUALITY_TUNE_TRIALS"
SEED = 0  # the draws' seed (recsync.tune's seed)
GRACE_EVALS = 4  # = quality.EVALS_PER_EPOCH: one epoch before ASHA may stop a trial
POLL_S = 0.2
SPACE_FILE = "space.toml"  # written into each sample's tuned folder beside the search

# The default search space (docs/tune.md's syntax): the three models the issue names, their
# learning rates, regularisation and dropout, and batches for small data.
SPACE = """\
"model.name" = {choice = ["dlrm", "dcn", "deepfm"]}
"train.dense_lr" = {loguniform = [1e-3, 1e-1]}
"train.embedding_lr" = {loguniform = [1e-2, 3e-1]}
"train.embedding_weight_decay" = {loguniform = [1e-7, 1e-3]}
"train.dense_weight_decay" = {loguniform = [1e-7, 1e-3]}
"model.dropout" = {uniform = [0.0, 0.3]}
"train.batch_size" = {choice = [32, 64, 128, 256]}
"""


def trials() -> int:
    """N: ``$RECSYNC_QUALITY_TUNE_TRIALS`` where set (0: no tuned arm), else ``TRIALS``."""
    raw = os.environ.get(TRIALS_ENV, "").strip()
    if not raw:
        return TRIALS
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{TRIALS_ENV}={raw!r}: give a whole number of trials (0: no tuned "
                         f"arm)") from None
    if n < 0:
        raise ValueError(f"{TRIALS_ENV}={raw!r}: give 0 (no tuned arm) or more")
    return n


def unavailable() -> str | None:
    """Why the scenario runs no tuned arm by default (N = 0, or no Ray Tune), or None."""
    if trials() == 0:
        return f"{TRIALS_ENV}=0: the tuned arm is off, and the tuned ratios are not written"
    from recsync.tuning.search import require_tune
    try:
        require_tune()
    except ModuleNotFoundError as e:
        return f"{e}: no tuned arm, and the tuned ratios are not written"
    return None


def _proc_cpu(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of ``pid`` from /proc, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class TreeCPU:
    """CPU seconds of this process and all its descendants over a block (module docstring):
    ``with TreeCPU() as t: ...`` then ``t.seconds``; ``t.processes``: descendants seen."""

    def __init__(self, poll_s: float = POLL_S):
        self.poll_s, self.seconds, self.processes = poll_s, 0.0, 0
        self._seen: dict[tuple[int, float], float] = {}  # (pid, first seen) -> last CPU
        self._ids: dict[int, tuple[int, float]] = {}
        self._before: dict[int, float] = {}
        self._stop = threading.Event()

    def _read(self) -> None:
        stats = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (s := _proc_cpu(int(name))) is not None:
                stats[int(name)] = s
        me, mine = os.getpid(), set()
        frontier = [me]
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        while frontier:
            for kid in children.get(frontier.pop(), ()):
                if kid not in mine:
                    mine.add(kid)
                    frontier.append(kid)
        for pid in mine:
            key = self._ids.get(pid)
            if key is None:  # a new process (or a reused pid: its own entry)
                key = self._ids[pid] = (pid, time.monotonic())
            self._seen[key] = stats[pid][1] - self._before.get(pid, 0.0)
        for pid in list(self._ids):
            if pid not in mine:
                del self._ids[pid]
                self._before.pop(pid, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._read()

    def __enter__(self) -> TreeCPU:
        self._self0 = _self_cpu()
        self._read()  # the descendants alive already count from here on
        self._before = {pid: cpu for (pid, _), cpu in self._seen.items()}
        self._seen.clear()
        self._ids.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
        self.processes = len(self._seen)
        self.seconds = _self_cpu() - self._self0 + sum(self._seen.values())


def _self_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _say(line: str) -> None:
    print(f"quality: {line}", file=sys.stderr, flush=True)


def tuned_arm(sample, data: Path, out: Path, n: int | None = None) -> dict:
    """The tuned arm of one sample (module docstring): ``quality.Tuned``."""
    import recsync
    from recsync.bench.quality import _configs, _recsync_arm
    from recsync.bench.quality_baselines import VALIDATION, columns
    from recsync.data.holdout import held_rows
    from recsync.data.reader import Dataset

    n = trials() if n is None else n
    rows = len(columns(Dataset(data), "train"))
    _, base = _configs(data, rows - held_rows(rows, VALIDATION))
    out.mkdir(parents=True, exist_ok=True)
    (out / SPACE_FILE).write_text(SPACE)
    _say(f"{sample.name}: recsync tune, {n} trials")
    started = time.perf_counter()
    with TreeCPU() as search_cpu:
        result = recsync.tune(base, out / SPACE_FILE, n, out / "search", seed=SEED,
                              grace_period=GRACE_EVALS, overwrite=True,
                              echo=lambda line: print(line, file=sys.stderr, flush=True))
    search_wall = time.perf_counter() - started
    if result.best_config is None:
        raise RuntimeError(f"{sample.name}: no trial of the search reported a validation "
                           f"evaluation ({out / 'search'})")
    chosen = recsync.load_config(result.best_config)
    seeds: list = []
    arm = _recsync_arm(chosen, chosen.model.name, out / "seeds", seeds)
    statuses = [t.status for t in result.trials]
    arm.update({
        "trials": n, "model": chosen.model.name, "values": dict(result.best.values),
        "best_validation_logloss": result.best.best_logloss,
        "trial_statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "search_cpu_s": search_cpu.seconds, "search_processes": search_cpu.processes,
        "search_wall_s": search_wall, "seeds_cpu_s": arm["cpu_s"],
        "cpu_s": search_cpu.seconds + arm["cpu_s"], "space": SPACE,
        "grace_evals": GRACE_EVALS})
    return arm
