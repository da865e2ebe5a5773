"""Scenario `simulated`: the virtual cluster (`recsync simulate`, docs/simulate.md) against the
EMULATED runtime at 2 and 4 workers, then the modes at the scale of the papers.

Validation: for each mode of ``VALIDATION_MODES`` and N in ``VALIDATION_WORKERS``, the real
runtime on the EMULATED cluster of scenario `stragglers` (workers of ``CORES_PER_WORKER`` cores,
``SHARDS`` shards of ``CORES_PER_SHARD``) and the simulator on the same data, model, batch and
seeds. The simulator's compute per step is the real run's own (the median of its metrics'
``worker_compute_s``, same seed: "the same timings"); its shards serve the `bench ps` costs
scaled to the CPU per call the real one-worker runs' shards were charged, an all-reduce's CPU
(measured, timing.py) on the worker's cores; what else a worker's step costs on the emulated
cluster (Ray's calls, the process's other threads, the client, paced on its cores) is fitted
per mode on a real run of ONE worker (``calibrate``: the step time the simulator does not
explain becomes its overhead), so that 2 and 4 workers test the rest of the model: contention
at the shards, the barrier, the event order. The fitted time is split between before and after
the compute (``pull_side_s``, ``push_side_s``) as the real runs' pacing split the worker's CPU
outside its compute (simulated_readings.py), and paced as the
EMULATED worker paces it (``Timing.paced``: its waits count toward it), so it is fitted again by
a few one-worker simulations (``CALIBRATION_ROUNDS``). The real steps' variation, measured on
the same one-worker runs (``real_jitter``), is the simulated workers' ``Timing.jitter``: equal
workers then drift apart as real ones do; the share of it that a host's workers share
(``Timing.jitter_common``, which does not set them apart) is the correlation of two real workers'
step times (``real_jitter_common``, the async and gba runs of 2). Compared: the samples/s
after the same warm-up (real: wall seconds; simulated: simulated seconds), the mean staleness,
and the eval AUC against the real runs' spread over seeds.

Scale (simulated only): sync, gba and async at ``SCALE_WORKERS`` workers, with 10% stragglers
2-5x slower (the same draw in every arm) and, at 128, without; one pass over the same data in
every arm, the compute cost measured once here; samples/s over the whole run (simulated
seconds); ``PARALLEL`` simulations at a time, each on a core of its own. Every seed at 128
workers (the acceptance's figures), seed 0 only at the other sizes.

Ratios (the names the issue's checks read): ``validation_speed_error_max`` (the largest
|simulated / real samples/s - 1| over the validation arms), ``gba_vs_sync_speed_128`` and
``gba_minus_sync_auc_128`` (with stragglers; the difference paired by seed), ``wall_s_512``
(the real wall time of the 512-worker gba simulation, seconds), and shadow's
(simulated_shadow.py: ``shadow_64_vs_1_efficiency``, S-* - FR-* AUC).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from recsync.api import override
from recsync.bench import emulated as em
from recsync.bench import overhead as ov
from recsync.bench.processes import map_ordered
from recsync.bench.simulated_readings import (SHARD_COSTS, pull_round_trip_s, real_compute_s,
                                               real_jitter, real_jitter_common,
                                               real_pull_side_share, real_side_cpu_s,
                                               run_sides, scaled_shards, shard_cpu_per_call,
                                               shard_cpu_split)
from recsync.bench.simulated_tables import validation_tables
from recsync.bench import seeds as sd
from recsync.config import RunConfig, load_config
from recsync.data.reader import Dataset
from recsync.metrics.core import read_jsonl
from recsync.simulation.run import measure_compute_s, measure_sides, simulate
from recsync.simulation.timing import Speeds, Timing

VALIDATION_MODES = ("sync", "async", "gba")
COMMON_JITTER_MODES = ("async", "gba")  # their workers' step times are their own (not sync's)
VALIDATION_WORKERS = (2, 4)
SCALE_WORKERS = (32, 128, 512)
SCALE_MODES = ("sync", "gba", "async")
SHARDS = 2
CORES_PER_WORKER, CORES_PER_SHARD = 0.2, 0.35  # scenario `stragglers`' emulated cluster
# At 128 workers x 32 the global batch is 4,096, the one the defaults were tuned at; one pass
# over SCALE_ROWS then gets sync within about 0.01 of the Bayes AUC (measured 2026-11-27: sync,
# 128 workers, 10% stragglers, one seed: 0.8311 against 0.8436, 568 s of real time).
VALIDATION_BATCH, SCALE_BATCH = 512, 32
VALIDATION_ROWS, SCALE_ROWS, EVAL_ROWS = 120_000, 1_000_000, 50_000  # at --scale 1
SCALE_SHARDS = 8
CALIBRATION_ROUNDS = 3  # simulations of one worker that fit its paced overhead
PARALLEL = 2  # simulations at scale at a time: one per core of this machine
STRAGGLERS = Speeds(kind="stragglers", share=0.1, low=2.0, high=5.0, seed=0)
COMMON = ["model.bottom_mlp=[64, 32]", "model.top_mlp=[64, 32]", "train.threads=1",
          "output.progress=false", "output.plot=false", "output.log_every_steps=1",
          "train.eval_every_samples=1000000000000",  # only the final evaluation
          "train.dense_warmup_steps=0"]


def base_config(data: Path, mode: str, workers: int, shards: int, batch: int) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", f'mode="{mode}"',
                              f"cluster.workers={workers}", f"cluster.ps_shards={shards}",
                              f"train.batch_size={batch}", f"data.chunk_rows={4 * batch}",
                              *COMMON])


def emulated_shard_time() -> Timing:
    """The default model of time on the EMULATED cluster: the shard's costs (measured on one
    core) on the emulated shard's ``CORES_PER_SHARD``, an all-reduce's CPU on the worker's
    ``CORES_PER_WORKER``, and the worker's own CPU paced as the emulated worker paces it
    (``Timing.paced``)."""
    t = Timing(paced=True)
    return replace(t, **{k: getattr(t, k) / (CORES_PER_SHARD if k in SHARD_COSTS
                                             else CORES_PER_WORKER)
                         for k in (*SHARD_COSTS, "collective_cpu_s_per_call",
                                   "collective_cpu_s_per_message", "collective_cpu_s_per_byte")})


def run_simulated(timings: dict[str, Timing], steady: bool = True):
    """A seeded_runs runner: one simulation of the arm with its model of time (``timings`` by
    arm: a Timing, or one per seed), with the statistics run_arm gives a real run:
    ``steady``, samples/s after the same warm-up (on the simulated clock), else over the whole
    run (at hundreds of workers a pass holds a few steps per worker: the warm-up would be most
    of it)."""
    def run_one(cfg: RunConfig, out_dir: Path, name: str) -> dict:
        timing = timings[name]
        timing = timing[cfg.train.seed] if isinstance(timing, list) else timing
        return simulate_arm(cfg, out_dir, name, timing, steady)
    return run_one


def simulate_arm(cfg: RunConfig, out_dir: Path, name: str, timing: Timing,
                 steady: bool) -> dict:
    """One simulation of an arm (``run_simulated``); a plain function, so that a process pool
    can run it."""
    summary = simulate(cfg, out_dir, timing=timing, overwrite=True)
    if steady:
        rate = ov.steady_rate(read_jsonl(out_dir / "metrics.jsonl"),
                              ov.WARMUP_STEPS * cfg.cluster.workers * cfg.train.batch_size)
    else:
        rate = {"samples_per_s": summary["samples_per_s"], "worker_step_s_median": None,
                "window_s": summary["train_s"], "window_samples": summary["samples"],
                "window_start_s": 0.0, "first_step_done_s": 0.0}
    s = summary["simulated"]
    over = "after warm-up" if steady else "over the run"
    print(f"  {name}: SIMULATED {rate['samples_per_s']:,.0f} samples/s {over}; "
          f"real wall {s['real_wall_s']:.1f} s", flush=True)
    return {**summary, "summary_samples_per_s": summary["samples_per_s"], **rate,
            "out_dir": str(out_dir), "cpu": None, "memory": None}


def parallel_seeded_runs(configs: dict[str, RunConfig], timings: dict[str, Timing], out: Path,
                         seeds: int, once: tuple[str, ...] = (),
                         processes: int | None = None) -> dict[str, list[dict]]:
    """``seeds.seeded_runs`` of simulations over the whole run, ``processes`` at a time
    (default ``PARALLEL``): a simulation runs one thread at a time, so it holds one core; the
    arms, seeds and results are seeded_runs' (every arm of seed 0, then of seed 1, ...)."""
    jobs = [(name, s) for s in range(seeds) for name in configs
            if not (s > 0 and name in once)]
    args = [(override(configs[name], **{"train.seed": s}), out / "arms" / name / f"seed{s}",
             name, timings[name], False) for name, s in jobs]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for (name, s), result in zip(jobs, map_ordered(simulate_arm, args,
                                                   processes or PARALLEL)):
        print(f"seed {s + 1}/{seeds}: {name}: eval AUC {result['eval']['auc']:.4f}", flush=True)
        runs[name].append(result)
    return runs


def worker_sides(cfg: RunConfig, ds) -> dict:
    """A worker's CPU per step before and after its compute in ``cfg``'s mode, measured here
    (one core): Timing's pull_side_s and push_side_s."""
    pull, push = measure_sides(cfg, ds, Timing(compute_s=0.0, pull_side_s=0.0, push_side_s=0.0))
    return {"pull_side_s": pull, "push_side_s": push}


def validation(out: Path, scale: float, seeds: int) -> tuple[dict, dict, dict]:
    """(arms, per (mode, workers) comparison, per mode calibration) of the real EMULATED runs
    and the simulations."""
    data = em.make_data(out / "data_validation", max(40_000, round(VALIDATION_ROWS * scale)),
                        EVAL_ROWS)
    cells = [(m, n) for n in VALIDATION_WORKERS for m in VALIDATION_MODES]
    real = {f"real_{m}_{n}": override(base_config(data, m, n, SHARDS, VALIDATION_BATCH),
                                      **{"emulation.cores_per_worker": CORES_PER_WORKER,
                                         "emulation.cores_per_shard": CORES_PER_SHARD})
            for n in (1, *VALIDATION_WORKERS) for m in VALIDATION_MODES}
    runs = sd.seeded_runs(list(real), real.__getitem__, out, seeds)
    # the real steps' spread from one worker's runs: equal workers then drift apart as real
    # ones do (gba's and async's staleness; sync's wait for the slowest); the share of it
    # common to a host's workers (which does not set them apart) from two workers that do not wait
    # for each other (at 4 a line holds half the steps, and the workers' windows differ more)
    shard_time = replace(
        emulated_shard_time(),
        jitter=real_jitter([r for m in VALIDATION_MODES for r in runs[f"real_{m}_1"]]),
        jitter_common=real_jitter_common([r for m in COMMON_JITTER_MODES
                                          for r in runs[f"real_{m}_2"]]))
    calibration = {m: calibrate(data, m, runs[f"real_{m}_1"], shard_time,
                                out / "calibration" / m,
                                [r for n in (1, *VALIDATION_WORKERS)
                                 for r in runs[f"real_{m}_{n}"]])
                   for m in VALIDATION_MODES}
    sims = {f"sim_{m}_{n}": base_config(data, m, n, SHARDS, VALIDATION_BATCH) for m, n in cells}
    # each seed's compute and own CPU as the real run of that seed's: the machine's drift and
    # a worker's CPU are measurements, not the model's
    timings = {name: [scaled_shards(replace(shard_time, compute_s=real_compute_s(r),
                                            shard_background=calibration[m]["shard_background"],
                                            latency_s=calibration[m]["latency_s"],
                                            **run_sides(r, calibration[m])),
                                    calibration[m]["shard_scale"])
                      for r in runs[f"real_{m}_{n}"]]
               for name, (m, n) in zip(sims, cells)}
    sd.seeded_runs(list(sims), sims.__getitem__, out, seeds, results=runs,
                   run_arm=run_simulated(timings))
    arms = {name: sd.seeded_entry(r) for name, r in runs.items()}
    compared = {}
    for m, n in cells:
        r, s = arms[f"real_{m}_{n}"], arms[f"sim_{m}_{n}"]
        stale = [statistics.mean(x["staleness"]["mean"] or 0.0 for x in runs[f"{k}_{m}_{n}"])
                 for k in ("real", "sim")]
        compared[f"{m}_{n}"] = {
            "real_samples_per_s": r["samples_per_s"], "sim_samples_per_s": s["samples_per_s"],
            "speed_error": s["samples_per_s"] / r["samples_per_s"] - 1.0,
            "real_staleness_mean": stale[0], "sim_staleness_mean": stale[1],
            "staleness_difference": stale[1] - stale[0],
            "real_auc": r["auc_stats"], "sim_auc": s["auc_stats"],
            "auc_difference": s["auc_stats"]["mean"] - r["auc_stats"]["mean"],
            "compute_s": statistics.median(t.compute_s for t in timings[f"sim_{m}_{n}"]),
            **calibration[m]["sides"]}
    return arms, compared, calibration


def validation_ratios(compared: dict) -> dict:
    """The validation's ratios: the largest |simulated / real samples/s - 1| and |staleness
    difference| over its cells."""
    return {"validation_speed_error_max": max(abs(c["speed_error"]) for c in compared.values()),
            "validation_staleness_difference_max": max(abs(c["staleness_difference"])
                                                       for c in compared.values())}


def calibrate(data: Path, mode: str, real_runs: list[dict], shard_time: Timing,
              out: Path, mode_runs: list[dict] | None = None) -> dict:
    """The model of time fitted on one worker: the real EMULATED run's step time (batch /
    samples/s, median of seeds) against the simulation's of one worker with no overhead; the
    difference is what the simulator does not see of a worker's step on the emulated cluster
    (Ray's calls, the process's other threads, the client: paced on its cores), charged as
    ``overhead_s`` at 2 and 4 workers (in proportion to each real run's CPU per step outside
    the compute: ``run_sides``), which then test the rest of the model. First the
    shards' costs (bench ps's, of another day) are scaled to the CPU per call the real runs'
    shards were charged (``shard_scale``): their queues order 2 and 4 workers' calls. Where
    the mode's real runs at every size (``mode_runs``) tell a shard's CPU per call from its CPU
    by the second (``shard_cpu_split``: their shards' CPU, not their speed), the cost per call
    is the former, and each call is charged the latter since the shard's previous call, on the
    shard's cores, as the EMULATED pacer charges it (``Timing.shard_background``). Last, the
    latency: the real one-worker runs' pull round trip less the fitted simulation's, half each
    way (``latency_s``; the worker's handling of a call, at the machine's speed, is in the real
    round trip and not in the simulated one)."""
    timing = replace(shard_time, pull_side_s=0.0, push_side_s=0.0,
                     compute_s=statistics.median(real_compute_s(r) for r in real_runs))
    cfg = base_config(data, mode, 1, SHARDS, VALIDATION_BATCH)

    def simulated(sides: dict, name: str) -> dict:
        return run_simulated({name: replace(timing, **sides)})(cfg, out / name, name)

    last: dict = {}  # the latest of these simulations

    def step_s(sides: dict, name: str) -> float:
        last["run"] = simulated(sides, name)
        return VALIDATION_BATCH / last["run"]["samples_per_s"]

    real_cpu = [x for r in real_runs if (x := shard_cpu_per_call(r)) is not None]
    side_cpu = [x for r in real_runs if (x := real_side_cpu_s(r)) is not None]
    split = shard_cpu_split(mode_runs or [])
    per_call = split[0] if split else (statistics.median(real_cpu) if real_cpu else None)
    background = split[1] / CORES_PER_SHARD if split else 0.0
    modelled = (shard_cpu_per_call(simulated({}, "shards_as_measured"), CORES_PER_SHARD)
                if per_call else None)
    shard_scale = per_call / modelled if per_call and modelled else 1.0
    timing = replace(scaled_shards(timing, shard_scale), shard_background=background)
    real_step = VALIDATION_BATCH / statistics.median(r["samples_per_s"] for r in real_runs)
    sim_step = step_s({}, "without_overhead")
    overhead = max(0.0, real_step - sim_step)
    # split as the real runs' pacing split the worker's CPU outside the compute; where they do
    # not say (a summary from before pre_compute_cpu_s), as this process's CPU splits
    real_share = [x for r in real_runs if (x := real_pull_side_share(r)) is not None]
    if real_share:
        share = statistics.median(real_share)
    else:
        here = worker_sides(cfg, Dataset(data))
        share = here["pull_side_s"] / max(1e-12, here["pull_side_s"] + here["push_side_s"])

    def sides(total: float) -> dict:
        return {"pull_side_s": total * share, "push_side_s": total * (1 - share)}

    # paced: the worker's CPU is a floor that its waits count toward, so the step grows by
    # less than the overhead charged: fitted again (secant steps) until it is the real step
    tried, fitted = [0.0], [sim_step]
    for k in range(CALIBRATION_ROUNDS if timing.paced else 0):
        tried.append(overhead)
        fitted.append(step_s(sides(overhead), f"round{k + 1}"))
        slope = (fitted[-1] - fitted[-2]) / (tried[-1] - tried[-2] or 1.0)
        overhead = max(0.0, overhead + (real_step - fitted[-1]) / max(slope, 0.05))
    # a pull's round trip beyond the shard's work (the worker's handling of the call and its
    # transport, in real time): latency, half each way, fitted last (the section's floor
    # holds the longer wait: the step does not change)
    real_pull = [x for r in real_runs if (x := pull_round_trip_s(r)) is not None]
    sim_pull = pull_round_trip_s(last["run"])
    if real_pull and sim_pull is not None:
        timing = replace(timing, latency_s=timing.latency_s + max(
            0.0, statistics.median(real_pull) - sim_pull) / 2)
    return {"real_step_s": real_step, "sim_step_s_without_overhead": sim_step,
            "calibration_rounds": list(zip(tried, fitted)), "compute_s": timing.compute_s,
            "overhead_s": overhead, "pull_side_share": share,
            "pull_side_share_real": statistics.median(real_share) if real_share else None,
            "jitter": timing.jitter, "jitter_common": timing.jitter_common,
            "shard_cpu_per_call_modelled_s": modelled,
            "shard_cpu_per_call_real_s": statistics.median(real_cpu) if real_cpu else None,
            "shard_cpu_per_call_fitted_s": split[0] if split else None,
            "shard_cpu_per_s_fitted": split[1] if split else None,
            "shard_background": background,
            "shard_scale": shard_scale, "sides": sides(overhead),
            "side_cpu_s": statistics.median(side_cpu) if side_cpu else None,
            "pull_s_real": statistics.median(real_pull) if real_pull else None,
            "pull_s_simulated": sim_pull, "latency_s": timing.latency_s}


def at_scale(out: Path, scale: float, seeds: int) -> dict:
    """The simulated arms at scale: {name: seeded entry}."""
    data = em.make_data(out / "data_scale", max(100_000, round(SCALE_ROWS * scale)), EVAL_ROWS)
    probe = base_config(data, "sync", 1, 1, SCALE_BATCH)
    ds = Dataset(data)
    compute_s = measure_compute_s(probe, ds)
    sides = {m: worker_sides(base_config(data, m, 1, SCALE_SHARDS, SCALE_BATCH), ds)
             for m in SCALE_MODES}
    print(f"measured here: compute {compute_s * 1e3:.2f} ms per step; the worker's own CPU "
          f"before / after it: " + ", ".join(
              f"{m} {x['pull_side_s'] * 1e3:.2f} / {x['push_side_s'] * 1e3:.2f} ms"
              for m, x in sides.items()), flush=True)
    configs: dict[str, RunConfig] = {}
    timings: dict[str, Timing] = {}
    for n in SCALE_WORKERS:
        for m in SCALE_MODES if n == 128 else ("sync", "gba"):
            configs[f"{m}_{n}"] = base_config(data, m, n, SCALE_SHARDS, SCALE_BATCH)
            costs = Timing(compute_s=compute_s, **sides[m])
            timings[f"{m}_{n}"] = replace(costs, speeds=STRAGGLERS)
            if n == 128:
                configs[f"{m}_{n}_nostragglers"] = configs[f"{m}_{n}"]
                timings[f"{m}_{n}_nostragglers"] = costs
    once = tuple(name for name in configs if name.split("_")[1] != "128")
    runs = parallel_seeded_runs(configs, timings, out, seeds, once=once)
    return {name: sd.seeded_entry(r) for name, r in runs.items()}


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    started = time.perf_counter()
    valid_arms, compared, calibration = validation(out / "validation", scale, seeds)
    scale_arms = at_scale(out / "scale", scale, seeds)
    from recsync.bench import simulated_shadow as shadow
    shadow_arms, shadow_figures = shadow.arms_at_scale(out / "shadow", scale, seeds)
    arms = {**valid_arms, **scale_arms, **shadow_arms}
    gba_sync = sd.auc_difference(scale_arms, "gba_128", "sync_128")
    ratios = {
        **validation_ratios(compared),
        "gba_vs_sync_speed_128": (scale_arms["gba_128"]["samples_per_s"]
                                  / scale_arms["sync_128"]["samples_per_s"]),
        "gba_minus_sync_auc_128": gba_sync["mean"],
        "gba_vs_sync_speed_128_nostragglers": (
            scale_arms["gba_128_nostragglers"]["samples_per_s"]
            / scale_arms["sync_128_nostragglers"]["samples_per_s"]),
        "ideal_speed_ratio_128": em.ideal_speed_ratio(STRAGGLERS.schedule(128).initial()),
        "wall_s_512": scale_arms["gba_512"]["simulated"]["real_wall_s"],
        **shadow.ratios(shadow_figures),
    }
    wall_s = time.perf_counter() - started
    return {
        "scenario": "simulated",
        "emulation_label": (f"Validation arms real_*: {em.label(valid_arms)} Arms sim_* and "
                            f"the scale arms are SIMULATED (recsync simulate): their seconds "
                            f"are simulated seconds."),
        "description": (
            f"Validation: modes {', '.join(VALIDATION_MODES)} at "
            f"{' and '.join(map(str, VALIDATION_WORKERS))} workers x batch {VALIDATION_BATCH}, "
            f"{SHARDS} shards, real on the EMULATED cluster ({CORES_PER_WORKER} cores per "
            f"worker, {CORES_PER_SHARD} per shard) against SIMULATED with the real runs' "
            f"compute per step; scale: SIMULATED sync, gba, async at "
            f"{', '.join(map(str, SCALE_WORKERS))} workers x batch {SCALE_BATCH}, "
            f"{SCALE_SHARDS} shards, 10% of workers 2-5x slower (one draw) and none at 128; "
            f"synthetic data ({em.spec_text()}); {seeds} seeds (32 and 512 workers: seed 0). "
            f"{shadow.description(seeds)} Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms, "ratios": ratios, "validation": compared, "calibration": calibration,
        "differences": {"gba_minus_sync_auc_128": gba_sync, **shadow_figures["differences"]},
        "seeds": seeds, "wall_s": wall_s,
        "tables": {
            **validation_tables(compared, calibration),
            "AUC differences at scale, paired by seed (mean, 95% t-interval)": [
                sd.difference_row("gba_minus_sync_auc_128", gba_sync)],
            **shadow.tables(shadow_arms, shadow_figures),
            "Quality per arm": sd.auc_rows(arms),
            "Real wall time of each simulation (s)": [
                [n, a["simulated"]["real_wall_s"], f"{a['samples']:,} samples, "
                 f"{a['simulated']['simulated_train_s']:.1f} simulated s"]
                for n, a in scale_arms.items()],
        },
    }
