"""Scenario `ps`'s saturation curve: samples/s of DLRM in mode async with 1, 2, 4, 8 and 12
workers against one PS shard, on the EMULATED cluster, and where the shard's time goes.

Every worker and the shard is paced as a machine of its own with the same ``CORES`` cores
(recsync/cluster/emulation.py): 13 machines of 0.11 cores are 1.43 cores, within what the
config allows on 2 cores (2 less ``emulation.reserve_cores``). The same cores in every arm, so
that each arm adds machines of one kind and the curve measures the shard alone: the workers do
not share a core budget, and ideal scaling is N x the speed of one worker.

The model, batch and data are those of scenarios `overhead` and `scaling` (DLRM with the default
MLPs, 26 tables x 1e6 rows x 16, batch 4096 per worker, one intra-op thread), with the project's
default embedding optimizer (row-wise Adagrad, as the first half of scenario `ps` times). Every
arm starts from the model of a local run over the whole train split (``train.init_from``), so
every row an arm pulls is already initialised, as in a long run (the first half of `ps` touches
every row too): a fresh shard initialises the rows it sees first, which makes a pull several
times dearer (the probe shows both), and an arm with more workers would have its window later
in the tables' warming than one with fewer. Every worker does ``STEPS`` steps; samples/s is read
from the metrics log between the first record past ``WARMUP_STEPS`` steps per worker and the
last before ``TAIL_STEPS`` steps per worker remain (start-up and the workers' staggered ends are
not counted). One run per arm.

scaling efficiency(N) = samples/s(N) / (N x samples/s(1)). ``workers_per_shard_at_90pct`` is
the largest N measured such that N and every smaller N measured kept an efficiency of at least
0.9 (a dip below it counts, even if a larger N comes back over it); beside it, the linear
interpolation of the crossing, and the same figure against the best per-worker speed measured
(``_vs_best``): the emulated shard charges each request the CPU its process used since the
previous one less its idle rate (measured as training starts, cluster/emulation.py); what Ray's
threads use between calls above that rate still makes one worker (long gaps) slower per worker
than a few.

Where the shard's time goes: each arm's shard CPU per request and busy fraction (its paced
service time over the training time) from summary.json's ``emulation``, and ps_probe.py's CPU
per pull and per push.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from recsync.bench import overhead as ov
from recsync.bench.ps_probe import IDLE_S, shard_time

WORKERS = (1, 2, 4, 8, 12)
CORES = 0.11  # of every worker and of the shard: 13 x 0.11 = 1.43 <= 2 - 0.5 reserved
STEPS = 20  # per worker and arm, x --scale
WARMUP_STEPS = ov.WARMUP_STEPS  # per worker, at the start, not counted
TAIL_STEPS = 2  # per worker, at the end, not counted
EVAL_ROWS = 8192  # the final evaluation pulls through the paced shard: kept short
PROBE_CALLS = 10  # pulls and pushes of the probe (ps_probe.py), x --scale (at least 3)
TARGET = 0.9
COMMON = [f"emulation.cores_per_worker={CORES}", f"emulation.cores_per_shard={CORES}",
          'mode="async"', "cluster.ps_shards=1", 'train.embedding_optimizer="adagrad"',
          "output.save_model=false"]


# -- the curve's arithmetic (pure; tests/unit/test_bench_ps_saturation.py) ----------------------
def efficiencies(curve: dict[int, float]) -> dict[int, float]:
    """Scaling efficiency per number of workers: samples/s(N) / (N x samples/s(1)). ``curve``
    must hold N = 1."""
    if 1 not in curve or curve[1] <= 0:
        raise ValueError(f"the curve needs a positive samples/s at 1 worker, got {curve.get(1)}")
    return {n: s / (n * curve[1]) for n, s in sorted(curve.items())}


def efficiencies_vs_best(curve: dict[int, float]) -> dict[int, float]:
    """Efficiency against the best per-worker speed measured: samples/s(N) / (N x max over n
    of samples/s(n) / n). Never over 1: a super-linear point (one worker slower per worker than
    several) becomes the reference instead of flattering the others."""
    best = max(s / n for n, s in curve.items())
    return {n: s / (n * best) for n, s in sorted(curve.items())}


def workers_at(efficiency: dict[int, float], target: float = TARGET) -> int:
    """The largest N such that N and every smaller N measured have an efficiency >= target
    (1 at least: one worker is the reference)."""
    best = 1
    for n, e in sorted(efficiency.items()):
        if e < target and n > 1:
            break
        best = n
    return best


def workers_at_interpolated(efficiency: dict[int, float], target: float = TARGET) -> float | None:
    """Where the efficiency crosses ``target``, linear between the last measured N at or over it
    (``workers_at``) and the next N; None if no measured N after it falls under (the curve held
    to its last point)."""
    ns = sorted(efficiency)
    n0 = workers_at(efficiency, target)
    later = [n for n in ns if n > n0]
    if not later:
        return None
    n1 = later[0]
    e0, e1 = efficiency[n0], efficiency[n1]
    if e0 <= e1:  # not a descent (e.g. N = 1 over target, N = 2 under it by more): no slope
        return float(n0)
    return n0 + (n1 - n0) * (e0 - target) / (e0 - e1)


def window_rate(metrics: list[dict], start_samples: int, end_samples: int) -> dict:
    """Samples per second between the first record at or past ``start_samples`` and the first
    record that shows the last count at or before ``end_samples`` (records of metrics.jsonl:
    ``time_s``, ``samples``, one per poll). Each end is then the first poll after a step
    ended, so the window is off by less than a poll at either end (not by a whole step)."""
    inside = [r for r in metrics if start_samples <= r["samples"] <= end_samples]
    if inside:
        a = inside[0]
        b = next(r for r in inside if r["samples"] == inside[-1]["samples"])
    if not inside or b["time_s"] <= a["time_s"]:
        raise RuntimeError(f"too few metrics records between {start_samples:,} and "
                           f"{end_samples:,} samples ({len(inside)}) to measure a rate; run "
                           f"more steps (--scale)")
    return {"samples_per_s": (b["samples"] - a["samples"]) / (b["time_s"] - a["time_s"]),
            "window_s": b["time_s"] - a["time_s"], "window_samples": b["samples"] - a["samples"],
            "window_start_s": a["time_s"]}


def window_step_times(metrics: list[dict], start_s: float, end_s: float) -> dict:
    """Median over the workers' per-interval figures in [start_s, end_s]: a step's wall time and
    its compute section's (the rest is the pull, the push and their waits)."""
    def median(key):
        values = [v for r in metrics if start_s < r["time_s"] <= end_s
                  for v in (r.get(key) or []) if v]
        return statistics.median(values) if values else None
    return {"step_s": median("worker_step_s"), "compute_s": median("worker_compute_s")}


# -- the runs -----------------------------------------------------------------------------------
def arm_config(data: Path, workers: int, steps: int, warm: Path):
    return ov.arm_config(data, steps, [*COMMON, f"cluster.workers={workers}",
                                       f"train.init_from={json.dumps(str(warm))}"])


def measure(out: Path, scale: float) -> dict:
    """Run the warm-up model, every arm and the probe; the curve's part of the result."""
    steps = max(WARMUP_STEPS + TAIL_STEPS + 4, round(STEPS * scale))
    most = max(WORKERS)
    # every worker's steps, plus a chunk per worker that a worker may stop in the middle of
    rows = most * (steps + 16) * ov.BATCH
    data = ov.make_data(out / "saturation_data", rows, ov.TABLE_ROWS, eval_rows=EVAL_ROWS)
    warm = warm_model(data, out / "saturation_warm", rows // ov.BATCH)
    cfgs = {f"async_{n}w": arm_config(data, n, steps, warm) for n in WORKERS}
    arms = {}
    for name, cfg in cfgs.items():
        print(f"saturation: {name} ({steps} steps per worker, EMULATED) ...", flush=True)
        arms[name] = arm_result(cfg, out / "arms" / name, name, steps)
    probe = shard_time(cfgs["async_1w"], data, max(3, round(PROBE_CALLS * scale)))
    return {"arms": arms, "probe": probe, "steps": steps,
            "configs": {f"{n} (recsync config)": c.to_toml() for n, c in cfgs.items()}}


def warm_model(data: Path, out: Path, steps: int) -> Path:
    """A local run over the whole train split: its model directory holds every row the arms
    will read, so that each arm's shard starts with them initialised (``train.init_from``),
    as after a long run, and no arm pays more or less lazy initialisation than another."""
    from recsync.run.driver import run as run_training
    print(f"saturation: a local run over the {steps} batches, so that every arm starts with "
          f"their rows (train.init_from) ...", flush=True)
    # with the optimizers' state: a fresh dense Adagrad's first steps would jolt the model
    cfg = ov.arm_config(data, steps, ['mode="local"', 'train.embedding_optimizer="adagrad"',
                                      "output.save_optimizer_state=true"])
    run_training(cfg, out, overwrite=True)
    return out / "model"


def arm_result(cfg, out_dir: Path, name: str, steps: int) -> dict:
    """One run (ov.run_arm: the summary, CPU and memory) with samples/s over this curve's
    window, the workers' step and compute times in it, and the shard's figures."""
    from recsync.metrics.core import read_jsonl
    r = ov.run_arm(cfg, out_dir, name)
    n, batch = cfg.cluster.workers, cfg.train.batch_size
    metrics = read_jsonl(Path(out_dir) / "metrics.jsonl")
    rate = window_rate(metrics, WARMUP_STEPS * n * batch, (steps - TAIL_STEPS) * n * batch)
    times = window_step_times(metrics, rate["window_start_s"],
                              rate["window_start_s"] + rate["window_s"])
    entry = {**ov.arm_entry([r]), **rate, "rounds_samples_per_s": [rate["samples_per_s"]],
             "workers": n, "window": times, "emulation_held": emulation_held(r),
             "shard": shard_figures(r)}
    print(f"  {name}: {rate['samples_per_s']:,.0f} samples/s in the window (EMULATED); "
          f"shard busy {entry['shard']['busy_fraction'] or 0:.0%}", flush=True)
    return entry


def emulation_held(summary: dict) -> dict:
    """How closely the processes kept their emulated cores' pace (summary.json's emulation):
    the workers' compute wall / CPU over the expected 1 / cores (median, and the largest
    deviation from 1), and the shard's time it ran late (work slower than its cores)."""
    e = summary.get("emulation") or {}
    ratios = [w["compute_wall_per_cpu"] / w["expected"] for w in e.get("workers", [])
              if w.get("compute_wall_per_cpu") and w.get("expected")]
    return {"worker_pace": statistics.median(ratios) if ratios else None,
            "worker_worst_deviation": max((abs(x - 1) for x in ratios), default=None),
            "shard_late_s": sum(s["late_s"] for s in e.get("shards", []))}


def shard_figures(summary: dict) -> dict:
    """The shard's CPU per request and busy fraction over the run (training and the final
    evaluation's pulls), from summary.json's emulation and per_shard."""
    shards = (summary.get("emulation") or {}).get("shards") or []
    if not shards:
        return {"cpu_ms_per_request": None, "busy_fraction": None, "late_s": None}
    s, counts = shards[0], (summary.get("per_shard") or [{}])[0]
    requests = s["requests"] or 1
    train_s = summary.get("train_s") or 0.0
    return {"requests": s["requests"], "pulls": counts.get("pulls"),
            "pushes": counts.get("pushes"), "cpu_s": s["cpu_s"],
            "cpu_ms_per_request": s["cpu_s"] / requests * 1e3,
            "paced_wall_s": s["paced_wall_s"], "late_s": s["late_s"],
            "idle_cores": s.get("idle_cores"),
            "busy_fraction": s["paced_wall_s"] / train_s if train_s > 0 else None}


# -- the result ---------------------------------------------------------------------------------
def label() -> str:
    n = max(WORKERS)
    return (f"The saturation curve ran on an EMULATED cluster: 1 to {n} workers x {CORES:g} "
            f"cores and 1 PS shard x {CORES:g} cores, each paced as a machine of its own on "
            f"this one machine; its samples/s are EMULATED figures.")


def result_part(measured: dict, out: Path) -> dict:
    """The curve's ratios, arms, tables and description for scenario ps's result, and its plot
    (``saturation.png`` in ``out``)."""
    arms = measured["arms"]
    curve = {a["workers"]: a["samples_per_s"] for a in arms.values()}
    eff, vs_best = efficiencies(curve), efficiencies_vs_best(curve)
    at = workers_at(eff)
    crossing = workers_at_interpolated(eff)
    plot(out / "saturation.png", curve, eff, vs_best)
    ratios = {"workers_per_shard_at_90pct": at,
              "workers_per_shard_at_90pct_interpolated": crossing,
              "workers_per_shard_at_90pct_vs_best": workers_at(vs_best),
              **{f"saturation_efficiency_{n}w": e for n, e in eff.items()}}
    probe = measured["probe"]
    rows = []
    for name, a in arms.items():
        n, sh, w = a["workers"], a["shard"], a["window"]
        wait = (None if not (w["step_s"] and w["compute_s"])
                else 1.0 - w["compute_s"] / w["step_s"])
        rows.append([name, n, a["samples_per_s"], n * curve[1], eff[n], vs_best[n],
                     sh["busy_fraction"], sh["cpu_ms_per_request"], w["step_s"], w["compute_s"],
                     wait, sh["late_s"]])
    header = ["arm", "workers", "samples/s (EMULATED)", "ideal N x samples/s(1)", "efficiency",
              "efficiency vs best per worker", "shard busy fraction", "shard CPU ms / request",
              "worker step s (median)", "of which compute s", "step not computing",
              "shard late s"]
    from recsync.bench.report import _table
    most = arms[max(arms, key=lambda k: arms[k]["workers"])]
    one = next(a for a in arms.values() if a["workers"] == 1)
    per_request = most["shard"]["cpu_ms_per_request"] or float("nan")
    # one pull and one push of BATCH samples per step, at the shard's CPU per request under load
    capacity = ov.BATCH * CORES / (2 * per_request / 1e3)
    best_n = max(curve, key=lambda n: curve[n] / n)
    description = (
        f"\n\n**The saturation curve (EMULATED).** {label()} Mode async, DLRM with the default "
        f"MLPs, 26 tables x {ov.TABLE_ROWS:,} rows x 16, row-wise Adagrad on the shard (which "
        f"also holds the dense parameters and applies their Adagrad), batch {ov.BATCH} per "
        f"worker, {measured['steps']} steps per worker, one run per arm. samples/s between the "
        f"first metrics record past {WARMUP_STEPS} steps per worker and the last before "
        f"{TAIL_STEPS} steps per worker remain; efficiency = samples/s(N) / (N x samples/s(1)); "
        f"`workers_per_shard_at_90pct` = the largest N such that N and every smaller N measured "
        f"kept an efficiency >= {TARGET} (interpolated crossing beside it). Shard busy fraction: "
        f"its paced service time (CPU / {CORES:g} cores, and any lateness) over the run's "
        f"train_s (it includes the final evaluation's pulls of {EVAL_ROWS:,} rows); step not "
        f"computing: 1 - compute / step of a worker (the pull, the push and the waits for the "
        f"shard). Plot: `saturation.png`.\n\n" + _table(header, rows) + "\n\n"
        f"Where the shard's time goes (probe: {probe['calls']} pulls, then the same pulls "
        f"again, then their pushes, through PSClient to a fresh PSShard on {CORES:g} emulated "
        f"cores, batches of this data set, {probe['rows_per_call']:,.0f} unique rows per call "
        f"and {probe['dense_params']:,} dense parameters each way, the shard's EmulatedMachine "
        f"CPU totals read between the blocks): a pull of initialised rows "
        f"{probe['pull_cpu_ms']:.1f} ms of the shard's CPU (of new rows: "
        f"{probe['cold_pull_cpu_ms']:.1f} ms), a push {probe['push_cpu_ms']:.1f} ms; of which "
        f"ShardCore's own work in process: pull {probe['core_pull_cpu_ms']:.1f} ms (new rows "
        f"{probe['core_cold_pull_cpu_ms']:.1f}), push {probe['core_push_cpu_ms']:.1f} ms (rows "
        f"alone {probe['core_push_rows_cpu_ms']:.1f}, the dense update alone "
        f"{probe['core_push_dense_cpu_ms']:.1f}); the rest is the shard process's CPU around "
        f"the core: the handling of the call (the arms' and the probe's `cluster.transport`, "
        f"the direct path by default: arguments, answers, event loop) and Ray's threads. "
        f"In the arms, the shard's CPU per request fell from "
        f"{one['shard']['cpu_ms_per_request']:.1f} ms at 1 worker to {per_request:.1f} ms at "
        f"{most['workers']}: the emulated machine charges a request the CPU its process used "
        f"since the previous one ended less the process's idle rate, measured as training "
        f"started ({_cores(one['shard'].get('idle_cores'))} cores at 1 worker; the probe's "
        f"idle shard used {probe['idle_cores']:.3f} cores, {probe['idle_cores'] / CORES:.0%} "
        f"of its {CORES:g} cores, which were charged to requests before and made most of its "
        f"time). What Ray's threads use between calls above that rate still lands on the next "
        f"request, most where the gaps are long: samples/s at 1 worker is lower than a "
        f"machine that did that work while idle would give, and every efficiency against it "
        f"is flattered by as much (points over 1 are this). Against the best per-worker speed "
        f"measured (at {best_n} worker(s)) the 90% figure is "
        f"{ratios['workers_per_shard_at_90pct_vs_best']} "
        f"(`workers_per_shard_at_90pct_vs_best`). At the CPU per request of "
        f"{most['workers']} workers the shard serves at most {capacity:,.0f} samples/s (one "
        f"pull and one push of {ov.BATCH} samples per step at {CORES:g} cores), "
        f"{capacity / curve[1]:.1f}x one worker's samples/s.")
    held = [[f"{name}: workers' compute wall / CPU over 1 / cores",
             a["emulation_held"]["worker_pace"],
             "median of the workers; largest deviation from 1: "
             + _pct(a["emulation_held"]["worker_worst_deviation"])
             + f"; the shard ran late (slower than its cores) "
               f"{a['emulation_held']['shard_late_s']:.2f} s"] for name, a in arms.items()]
    tables = {
        "Saturation curve: did the EMULATED cores hold?": held,
        "Saturation curve: CPU used while measured (cores; EMULATED arms)": ov.cpu_rows(arms),
        "Saturation curve: memory, peak RSS of the whole job": ov.memory_rows(arms),
        "Saturation curve: where the shard's time goes (probe, CPU ms per call)": [
            ["pull, whole shard process", probe["pull_cpu_ms"],
             "rows initialised; EmulatedMachine cpu_s delta over the block / calls"],
            ["pull of new rows, whole shard process", probe["cold_pull_cpu_ms"],
             "the same batches' first pull: lazy initialisation"],
            ["push, whole shard process", probe["push_cpu_ms"], "rows and the dense update"],
            ["pull, ShardCore in process", probe["core_pull_cpu_ms"], "median"],
            ["pull of new rows, ShardCore in process", probe["core_cold_pull_cpu_ms"], "median"],
            ["push, ShardCore in process", probe["core_push_cpu_ms"], "median"],
            ["push rows alone, ShardCore", probe["core_push_rows_cpu_ms"], "no dense gradient"],
            ["push dense alone, ShardCore", probe["core_push_dense_cpu_ms"], "no rows"],
            ["the shard process's CPU while idle (cores)", probe["idle_cores"],
             f"over {IDLE_S:g} s without calls (Ray's threads); the arms' shards measure theirs "
             f"as training starts, and their machines do not charge it to requests (the probe's "
             f"figures above include it)"],
            ["shard capacity (samples/s, EMULATED)", capacity,
             f"{ov.BATCH} x {CORES:g} cores / (2 x CPU per request at {most['workers']} "
             f"workers)"]],
    }
    return {"ratios": ratios, "arms": arms, "tables": tables, "description": description,
            "curve": {"workers": list(curve), "samples_per_s": list(curve.values()),
                      "efficiency": [eff[n] for n in curve],
                      "efficiency_vs_best": [vs_best[n] for n in curve],
                      "capacity_samples_per_s": capacity},
            "probe": probe, "configs": measured["configs"], "emulation_label": label()}


def _cores(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def plot(path: Path, curve: dict[int, float], eff: dict[int, float],
         vs_best: dict[int, float]) -> None:
    """samples/s against workers with the ideal N x samples/s(1), and the efficiencies with the
    target line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ns = sorted(curve)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(ns, [n * curve[1] for n in ns], "--", color="gray", label="ideal N x samples/s(1)")
    a.plot(ns, [curve[n] for n in ns], "o-", color="tab:blue", label="measured")
    a.set(xlabel="workers (1 PS shard)", ylabel="samples/s (EMULATED)", xticks=ns,
          title="DLRM async, one shard")
    b.plot(ns, [eff[n] for n in ns], "o-", color="tab:orange", label="vs 1 worker")
    b.plot(ns, [vs_best[n] for n in ns], "s:", color="tab:green",
           label="vs best per-worker speed")
    b.axhline(TARGET, ls="--", color="gray", label=f"{TARGET:.0%}")
    b.set(xlabel="workers (1 PS shard)", ylabel="scaling efficiency", xticks=ns,
          ylim=(0, 1.1), title=f"efficiency; {CORES:g} cores per machine (EMULATED)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
