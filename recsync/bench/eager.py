"""Scenario `eager`: decoupled push and pull against pull-compute-push, with and without
staleness-aware learning rates, over an EMULATED network as slow as the computation, on an
EMULATED cluster.

N = 2 workers x ``CORES_PER_WORKER`` cores, S = 2 PS shards x ``CORES_PER_SHARD`` cores
(``[emulation]``: each process paces itself as a machine of that size), the synthetic data set
emulated.BENCH_SPEC, the default DLRM and optimizers but a dense learning rate of
0.003 instead of 0.01, batch 4096 per worker, one intra-op thread, one pass over the same
synthetic data in every arm. Why the lower rate: Adagrad's first steps move every weight by
about the learning rate; with the default 0.01 the first updates overshoot (the training loss
jumped to 7 even in the sequential arm), and with eager's extra step of staleness the
overshoot compounded into a collapse to the constant predictor (training loss 80-115 in the
first second, then stuck at 0.56; AUC 0.59 and 0.57 for eager and eager_lr, in a first run),
which leaves nothing to compare. The network is EMULATED
(``[network]``: every pull and push to a shard waits an added latency, half on the way there
and half on the way back). How it is set: a calibration run (mode eager, ``overlap = false``,
no emulated network, on the emulated cluster, ``CALIBRATION_STEPS`` steps per worker) measures
a step's compute time c and its communication time k (waiting for the pull and for the push);
the added latency is ``(c - k) / 2`` per call, so that a step's communication, a pull and a
push, takes about c in the sequential arm.

Arms (all with the same emulated network):
- ``sequential``: mode eager with ``eager.overlap = false``: pull, compute, push, each waited for;
- ``eager``: the next batch's pull sent before this one is computed, pushes not waited for
  (``lr_modulation = "none"``);
- ``eager_lr``: eager with the learning rate of each update x 1 / max(1, τ) (the default);
- ``eager_local``: eager applying its own last update to the pulled dense vector on the worker
  (``eager.own_update = "local"``: no wait) instead of taking the vector from its push's answer
  (the default "wait", in ``eager`` and ``eager_lr``: one push's round trip waited for per
  step), ``lr_modulation = "none"``;
- ``async``: the runtime's async mode (pull, compute, push without waiting for it), reference.

Ratios: ``eager_vs_sequential_iter_time`` (time per iteration, workers x batch / samples per
second after a warm-up, as in scenario `overhead`; lower is better; also ``eager_lr_...`` and
``eager_local_...``), ``eager_lr_minus_eager_auc``, ``eager_local_minus_eager_auc``,
and ``eager_lr_vs_eager_iters_to_target``: iterations (steps of all workers) until the training
loss, smoothed over ``LOSS_WINDOW`` records, first reaches a target, the higher of the two
arms' final smoothed losses (so both reach it); lower is better. Every arm runs once per seed
(``--seeds``, ``train.seed``; arms interleaved): speed is the median, AUC and iterations the
mean of the seeds, AUC differences paired by seed.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from recsync.bench import emulated as em
from recsync.bench import overhead as ov
from recsync.bench import seeds as sd
from recsync.config import RunConfig, load_config
from recsync.metrics.core import read_jsonl
from recsync.metrics.plot import plot_runs

ROWS = 300_000  # training rows at --scale 1
EVAL_ROWS = 100_000
WORKERS, SHARDS, BATCH = 2, 2, 4096
CORES_PER_WORKER, CORES_PER_SHARD = 0.25, 0.25
CHUNK_BATCHES = 4
CALIBRATION_STEPS = 25  # per worker
LOSS_WINDOW = 10  # metrics records (0.5 s polls) in the moving average of the training loss
DENSE_LR = 0.003
COMMON = [
    f"cluster.workers={WORKERS}", f"cluster.ps_shards={SHARDS}", f"train.batch_size={BATCH}",
    f"train.dense_lr={DENSE_LR}",
    "train.threads=1", f"data.chunk_rows={CHUNK_BATCHES * BATCH}", "output.progress=false",
    "output.plot=false", "output.log_every_steps=1",
    "train.eval_every_samples=1000000000000",  # only the final evaluation: throughput arms
    # no dense warm-up (the default 100 updates would span all ~60 of sync's updates here, and
    # the data set and sizes were chosen without it): docs/sync_modes.md has its own figures
    "train.dense_warmup_steps=0",
    *em.emulation_args(CORES_PER_WORKER, CORES_PER_SHARD),
]
ARMS = {
    "sequential": ['mode="eager"', "eager.overlap=false", 'eager.lr_modulation="none"'],
    "eager": ['mode="eager"', 'eager.lr_modulation="none"'],
    "eager_lr": ['mode="eager"', 'eager.lr_modulation="inverse"'],
    "eager_local": ['mode="eager"', 'eager.own_update="local"', 'eager.lr_modulation="none"'],
    "async": ['mode="async"'],
}


def arm_config(data: Path, args: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *COMMON, *args])


def calibrate(data: Path, out: Path) -> dict:
    """Compute and communication time of a sequential step on the emulated cluster, without
    an emulated network."""
    cfg = arm_config(data, [*ARMS["sequential"], f"train.max_steps={CALIBRATION_STEPS}"])
    summary = ov.run_arm(cfg, out, "calibration")
    split = summary["eager"]["iteration_s"]
    compute, comm = split["compute"], split["pull_wait"] + split["push_wait"]
    latency_ms = max(0.0, (compute - comm) / 2 * 1e3)
    return {"compute_s": compute, "communication_s": comm, "latency_ms": latency_ms}


def smoothed(losses: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(losses)):
        part = losses[max(0, i - window + 1):i + 1]
        out.append(sum(part) / len(part))
    return out


def loss_curve(out_dir: Path) -> list[tuple[int, float]]:
    """(iterations of all workers, training loss smoothed over LOSS_WINDOW records)."""
    records = [r for r in read_jsonl(out_dir / "metrics.jsonl") if r.get("loss") is not None]
    losses = smoothed([r["loss"] for r in records], LOSS_WINDOW)
    return [(r["samples"] // BATCH, loss) for r, loss in zip(records, losses)]


def iters_to(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((it for it, loss in curve if loss <= target), None)


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    data = em.make_data(out / "data", max(100_000, round(ROWS * scale)), EVAL_ROWS)
    print("calibrating: a sequential run without emulated network ...", flush=True)
    cal = calibrate(data, out / "calibration")
    network = [f"network.latency_ms={cal['latency_ms']:.1f}"]
    print(f"  compute {cal['compute_s'] * 1e3:.0f} ms, communication "
          f"{cal['communication_s'] * 1e3:.0f} ms per step: EMULATED latency "
          f"{cal['latency_ms']:.1f} ms per call", flush=True)
    cfgs = {name: arm_config(data, [*args, *network]) for name, args in ARMS.items()}
    runs = sd.seeded_runs(list(cfgs), cfgs.__getitem__, out, seeds)
    arms = {}
    for name, results in runs.items():
        entry = sd.seeded_entry(results)
        arms[name] = {**entry, "iter_time_s": WORKERS * BATCH / entry["samples_per_s"],
                      "eager_rounds": [r["eager"] for r in results]}
    plot_runs([out / "arms" / n / "seed0" for n in arms], out / "quality.png",
              labels=list(arms))
    # iterations to a target loss, per seed: the higher final smoothed loss of the two arms
    to_target = {"eager": [], "eager_lr": []}
    targets = []
    for s in range(seeds):
        curves = {n: loss_curve(out / "arms" / n / f"seed{s}") for n in to_target}
        target = max(c[-1][1] for c in curves.values())
        targets.append(target)
        for n, c in curves.items():
            to_target[n].append(iters_to(c, target))
    def iter_time(name):
        return arms[name]["iter_time_s"]

    ideals = {"eager_vs_sequential_iter_time": (iter_time("eager") / iter_time("sequential"),
                                                0.5),
              "eager_lr_vs_sequential_iter_time": (
                  iter_time("eager_lr") / iter_time("sequential"), 0.5),
              "eager_local_vs_sequential_iter_time": (
                  iter_time("eager_local") / iter_time("sequential"), 0.5)}
    diffs = {"eager_lr_minus_eager_auc": sd.auc_difference(arms, "eager_lr", "eager"),
             "async_minus_eager_auc": sd.auc_difference(arms, "async", "eager"),
             "eager_local_minus_eager_auc": sd.auc_difference(arms, "eager_local", "eager")}
    ratios = {name: measured for name, (measured, _) in ideals.items()}
    ratios["async_vs_sequential_iter_time"] = iter_time("async") / iter_time("sequential")
    ratios.update({name: d["mean"] for name, d in diffs.items()})
    ratios["eager_lr_vs_eager_iters_to_target"] = (statistics.mean(to_target["eager_lr"])
                                                   / statistics.mean(to_target["eager"]))
    worst = em.worst_worker_deviation(arms)
    if worst is not None:
        ratios["emulation_worst_worker_deviation"] = worst
    wall_s = time.perf_counter() - started
    return {
        "scenario": "eager",
        "emulation_label": em.label(arms),
        "description": (
            f"{WORKERS} workers x batch {BATCH}, {SHARDS} PS shards, one pass "
            f"over {arms['eager']['samples']:,} synthetic rows ({em.spec_text()}) in every arm; "
            f"default DLRM and optimizers with dense lr {DENSE_LR} (see the scenario's "
            f"docstring), 1 intra-op thread, chunks of {CHUNK_BATCHES} batches. NETWORK "
            f"EMULATED: {cal['latency_ms']:.1f} ms added to every PS call (half each way), "
            f"set from a calibration run without emulated network on the emulated cluster: "
            f"compute {cal['compute_s'] * 1e3:.0f} ms and communication "
            f"{cal['communication_s'] * 1e3:.0f} ms per sequential step, latency = (compute - "
            f"communication) / 2 so that a sequential step's pull and push take about its "
            f"compute time; with communication equal to compute, perfect overlap halves the "
            f"time per iteration (the ideal 0.5). {seeds} seeds per arm, arms interleaved: "
            f"time per iteration = workers x batch / samples per second after a warm-up of "
            f"{ov.WARMUP_STEPS} steps per worker, median of seeds; AUC on the whole eval split "
            f"({EVAL_ROWS:,} rows), mean of seeds, differences paired by seed. Iterations to "
            f"target: the training loss smoothed over {LOSS_WINDOW} records (0.5 s polls), the "
            f"target per seed the higher final smoothed loss of eager and eager_lr ("
            + ", ".join(f"{t:.4f}" for t in targets) + "); iterations: "
            + "; ".join(f"{n} " + ", ".join(str(x) for x in v) for n, v in to_target.items())
            + f". Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "ideals": {k: {"measured": m, "ideal": i, "of_ideal": m / i}
                   for k, (m, i) in ideals.items()},
        "differences": diffs,
        "seeds": seeds,
        "calibration": cal,
        "network_emulated": True,
        "iters_to_target": {"targets": targets, **to_target},
        "wall_s": wall_s,
        "tables": {
            "AUC differences, paired by seed (mean, 95% t-interval)": [
                sd.difference_row(n, d) for n, d in diffs.items()],
            "Quality per arm": sd.auc_rows(arms),
            "Time per iteration and where it goes": [
                row for n, a in arms.items() for row in _arm_rows(n, a)],
            "EMULATED cluster: wall time over CPU time of each process": em.emulation_rows(arms),
            "CPU used while measured (cores; 0.5 s polls of /proc)": ov.cpu_rows(arms),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


def _arm_rows(name: str, a: dict) -> list[list]:
    rows = [[f"{name}: time per iteration (s)", a["iter_time_s"],
             "samples/s per seed: " + ", ".join(f"{x:,.0f}" for x in a["rounds_samples_per_s"])]]
    eager = a["eager_rounds"][-1]
    if eager:
        split = eager["iteration_s"]
        rows.append([f"{name}: step (s): compute / waiting for pull / waiting for push",
                     split["step"], f"{split['compute']:.3f} / {split['pull_wait']:.3f} / "
                     f"{split['push_wait']:.3f} (last seed, means over steps)"])
        rows.append([f"{name}: τ known to the worker, mean (p99, max)", eager["tau"]["mean"],
                     f"p99 {eager['tau']['p99']}, max {eager['tau']['max']}; lr multiplier "
                     f"mean {eager['multiplier']['mean']:.3f}, min "
                     f"{eager['multiplier']['min']:.3f}"])
    if a["staleness"]["mean"] is not None:
        rows.append([f"{name}: staleness at the shards, mean (p99, max)", a["staleness"]["mean"],
                     f"p99 {a['staleness']['p99']}, max {a['staleness']['max']}"])
    return rows
