"""Scenario `overhead`: what the distributed runtime costs against the single-process trainer.

Arms (same DLRM, 26 tables x 1e6 rows x 16, default MLPs, batch 4096, one intra-op thread per
training process, SGD on embedding rows and Adagrad on dense parameters with the same learning
rates, the same synthetic data read in the same order, the same number of steps):

- ``local``: ``recsync train`` in mode local, the baseline.
- ``async_1w1s``: mode async on an embedded Ray instance, 1 worker, 1 PS shard (which holds the
  rows and the dense parameters and applies every push as it arrives).
- ``sync_1w``: mode sync, 1 worker, 1 PS shard (all-reduce of a group of one; the PS applies each
  step's row gradients before the next pull).

Every arm is a ``run.run`` call, as ``recsync train`` makes it. Throughput: each run's
``metrics.jsonl`` records (time, samples done) once per step in mode local and at every 0.5 s
poll of the workers in distributed modes; an arm's figure is the samples done between the first
record at or past a warm-up of ``WARMUP_STEPS`` steps per worker and the last record, divided by
the time between those records. So neither Ray's start-up nor the workers' (process start,
imports, first remote calls) is counted, in any arm. The ``samples_per_s`` of ``summary.json``
(samples / train_s) is reported beside it: its train_s starts at the first step (start-up is
summary.json's ``startup_s``) and so includes the warm-up steps. The arms alternate over
``ROUNDS`` rounds; each arm's figure is the median of its rounds and the ratios are ratios of
medians.

Memory: an ``RssSampler`` (memory.py) polls every 0.5 s, during every run, the RSS of the
benchmark process and of all its descendants (Ray's gcs_server, raylet, agents and daemons, the
PS shard, worker and work-queue actors) and keeps the peak of their sum and each process's peak.
Two extra short async_1w1s runs on one data set with 1e5-row tables, with model.table_rows 1e5
and 1e6, show whether a worker's RSS grows with the size of the tables. The sampler also reads
each process's CPU time and the machine's: the report gives the cores the workers, PS shards,
driver, Ray's own processes and everything outside the job used during each measured window.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from pathlib import Path

from recsync.bench.memory import RssSampler
from recsync.config import RunConfig, load_config
from recsync.data.format import NUM_TABLES
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.core import read_jsonl
from recsync.run.driver import run as run_training

ROUNDS = 2
STEPS = 100  # per worker and arm, x --scale
WARMUP_STEPS = 5  # per worker, not counted in samples/s
MEMORY_STEPS = 30  # each of the two table-size runs, x --scale
TABLE_ROWS = 1_000_000
BATCH = 4096
GB = 1e9
COMMON = [  # every arm of overhead and scaling
    f"model.table_rows={TABLE_ROWS}", "model.embedding_dim=16", f"train.batch_size={BATCH}",
    "train.threads=1", "train.embedding_optimizer=\"sgd\"", "train.embedding_lr=0.05",
    "train.dense_optimizer=\"adagrad\"", "train.dense_lr=0.01",
    "train.eval_every_samples=1000000000000", "data.shuffle=false", "output.progress=false",
    "output.plot=false", "output.log_every_steps=1",
]
ARMS = {
    "local": ["mode=\"local\""],
    "async_1w1s": ["mode=\"async\"", "cluster.workers=1", "cluster.ps_shards=1"],
    "sync_1w": ["mode=\"sync\"", "cluster.workers=1", "cluster.ps_shards=1"],
}


def run(out: Path, scale: float) -> dict:
    started = time.perf_counter()
    steps = max(2 * WARMUP_STEPS, round(STEPS * scale))
    data = make_data(out / "data", steps * BATCH, TABLE_ROWS)
    cfgs = {name: arm_config(data, steps, extra) for name, extra in ARMS.items()}
    runs = alternate(cfgs, out, ROUNDS)
    arms = {name: arm_entry(r) for name, r in runs.items()}
    base = arms["local"]
    ratios = {f"{m}_vs_local_speed": arms[a]["samples_per_s"] / base["samples_per_s"]
              for a, m in (("async_1w1s", "async"), ("sync_1w", "sync"))}
    summary_ratios = {k: arms[a]["summary_samples_per_s"] / base["summary_samples_per_s"]
                      for k, a in (("async_vs_local_speed", "async_1w1s"),
                                   ("sync_vs_local_speed", "sync_1w"))}
    per_round = {a: [x / y for x, y in zip(arms[a]["rounds_samples_per_s"],
                                           base["rounds_samples_per_s"])]
                 for a in ("async_1w1s", "sync_1w")}

    mem_steps = max(2 * WARMUP_STEPS, round(MEMORY_STEPS * scale))
    mem_data = make_data(out / "data_table_size", mem_steps * BATCH, 100_000)
    table_size: dict[int, list[dict]] = {100_000: [], 1_000_000: []}
    for r in range(ROUNDS):
        for rows in table_size:
            name = f"async_1w1s_rows{rows:.0e}".replace("+0", "")
            print(f"memory {r + 1}/{ROUNDS}: {name} ({mem_steps} steps) ...", flush=True)
            cfg = arm_config(mem_data, mem_steps, [*ARMS["async_1w1s"],
                                                   f"model.table_rows={rows}"])
            table_size[rows].append(run_arm(cfg, out / "arms" / name / f"round{r + 1}", name))
    wall_s = time.perf_counter() - started

    dist = ("async_1w1s", "sync_1w")
    peak_job = max(r["memory"]["peak_total_rss"] for a in dist for r in runs[a]) / GB
    w5, w6 = (max(r["memory"]["worker_peak_rss"] for r in table_size[n]) / GB
              for n in (100_000, 1_000_000))
    return {
        "scenario": "overhead",
        "description": (
            f"{ROUNDS} alternating rounds of {steps} steps x {BATCH} samples per arm; 26 tables "
            f"x {TABLE_ROWS:,} rows x 16, default DLRM MLPs, 1 intra-op thread per training "
            f"process. samples/s counts the steps after a warm-up of {WARMUP_STEPS} steps, "
            f"from the runs' metrics logs (see the table 'Throughput as summary.json reports "
            f"it' for samples / train_s). Per-round ratios: "
            + "; ".join(f"{a}/local {', '.join(f'{x:.3f}' for x in v)}"
                        for a, v in per_round.items())
            + f". Peak RSS of the whole job (all processes) in the distributed arms: "
            f"{peak_job:.2f} GB; a worker's peak RSS with 1e5 / 1e6 rows per table: "
            f"{w5:.3f} / {w6:.3f} GB (max of {ROUNDS} runs each). Scenario wall time "
            f"{wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "ratios_from_summary_json": summary_ratios,
        "memory": {"peak_job_rss_gb": peak_job, "worker_peak_rss_gb_rows_1e5": w5,
                   "worker_peak_rss_gb_rows_1e6": w6,
                   "table_size_runs": {str(k): [r["memory"] for r in v]
                                       for k, v in table_size.items()}},
        "wall_s": wall_s,
        "tables": {
            "Memory: the two figures": [
                ["whole job's peak RSS (GB), distributed arms", peak_job,
                 f"all processes summed (driver, Ray's, PS, worker, queue), max of "
                 f"{len(dist) * ROUNDS} runs; the issue's limit is 5 GB"],
                ["a worker's peak RSS (GB), 1e5 rows per table", w5,
                 f"async_1w1s, {mem_steps} steps, max of {ROUNDS} runs"],
                ["a worker's peak RSS (GB), 1e6 rows per table", w6,
                 "the same runs with model.table_rows = 1e6 on the same data"],
            ],
            "Throughput as summary.json reports it (train_s from the first step)":
                summary_rows(arms, summary_ratios),
            "Start-up and measurement window (medians of rounds)": timeline_rows(arms),
            "CPU used while measured (cores; 0.5 s polls of /proc)": cpu_rows(arms),
            "Memory: peak RSS of the whole job, all processes summed": memory_rows(arms),
            f"Memory: RSS vs table size (async_1w1s, {mem_steps} steps, one data set with "
            f"1e5-row tables)": table_size_rows(table_size),
        },
        "configs": {f"{name} (recsync config)": cfg.to_toml() for name, cfg in cfgs.items()},
    }


# -- shared with the scaling scenario ----------------------------------------------------------
def make_data(path: Path, rows: int, max_table_rows: int, eval_rows: int = 50_000) -> Path:
    print(f"generating {rows:,} + {eval_rows:,} synthetic rows (tables up to "
          f"{max_table_rows:,} rows) ...", flush=True)
    generate(path, rows=rows, eval_rows=eval_rows, overwrite=True, progress=False,
             spec=SynthSpec(max_table_rows=max_table_rows))
    return path


def arm_config(data: Path, steps: int, extra: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", f"train.max_steps={steps}",
                              *COMMON, *extra])


@contextlib.contextmanager
def embedded_ray():
    """Make ``ray.init()`` start this run's own instance. Without an address Ray joins the
    machine's most recent ``ray start`` cluster (/tmp/ray/ray_current_cluster) if there is one,
    which a benchmark must not do (and cluster/ray_session.py's num_cpus makes it fail)."""
    old = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = "local"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = old


def steady_rate(metrics: list[dict], warmup_samples: int) -> dict:
    """Samples per second between the first record at or past ``warmup_samples`` and the last
    one written while training went on. The records that count the last samples are left out
    where two others remain: the watch loop writes the first at its first poll after the end
    (distributed/watch.py; the simulator as well), up to half a second of no training that a
    window of a few seconds would count as up to 10% of its time."""
    done = [r for r in metrics if r["samples"] >= warmup_samples]
    going = [r for r in done if r["samples"] < done[-1]["samples"]] if done else []
    if len(going) >= 2:
        done = going
    first_step = next((r["time_s"] for r in metrics if r["samples"] > 0), None)
    if len(done) < 2 or done[-1]["time_s"] <= done[0]["time_s"]:
        raise RuntimeError(f"too few metrics records after the warm-up ({len(done)}) to "
                           f"measure a rate; run more steps (--scale)")
    a, b = done[0], done[-1]
    step_s = [s for r in done[1:] for s in (r.get("worker_step_s") or []) if s]
    return {"samples_per_s": (b["samples"] - a["samples"]) / (b["time_s"] - a["time_s"]),
            "worker_step_s_median": statistics.median(step_s) if step_s else None,
            "window_s": b["time_s"] - a["time_s"], "window_samples": b["samples"] - a["samples"],
            "window_start_s": a["time_s"], "first_step_done_s": first_step}


def run_arm(cfg: RunConfig, out_dir: Path, name: str) -> dict:
    """One ``run.run`` with the memory sampler around it; the summary plus what we measured."""
    ctx = embedded_ray() if cfg.distributed else contextlib.nullcontext()
    with ctx, RssSampler() as sampler:
        begin = time.perf_counter()  # the run's start, give or take a few ms
        summary = run_training(cfg, out_dir, overwrite=True)
    workers = cfg.cluster.workers if cfg.distributed else 1
    rate = steady_rate(read_jsonl(Path(out_dir) / "metrics.jsonl"),
                       WARMUP_STEPS * workers * cfg.train.batch_size)
    # metrics' time_s counts from the first step, after start-up
    window = begin + (summary.get("startup_s") or 0.0) + rate["window_start_s"]
    cpu = sampler.cpu_between(window, window + rate["window_s"])
    result = {**summary, "summary_samples_per_s": summary["samples_per_s"], **rate,
              "out_dir": str(out_dir), "cpu": cpu,
              "memory": {**sampler.result(), "run_s": summary["wall_s"]}}
    mem = result["memory"]
    print(f"  {name}: {rate['samples_per_s']:,.0f} samples/s after warm-up "
          f"(summary.json: {summary['samples_per_s']:,.0f}); {summary['samples']:,} samples, "
          f"wall {summary['wall_s']:.1f} s; job peak RSS {mem['peak_total_rss'] / GB:.2f} GB"
          + (f", worker {mem['worker_peak_rss'] / GB:.2f} GB" if mem["worker_peak_rss"] else ""),
          flush=True)
    if cpu:
        print(f"    cores used while measured: {cpu_text(cpu)}", flush=True)
    return result


CPU_GROUPS = {"worker": "workers", "ps_shard": "PS shards", "driver": "driver",
              "work_queue": "work queue"}  # every other role of the job: Ray's own processes


def cpu_groups(cpu: dict) -> dict[str, float]:
    out = {label: 0.0 for label in CPU_GROUPS.values()}
    out["Ray's processes"] = 0.0
    for role, cores in cpu["cores_by_role"].items():
        out[CPU_GROUPS.get(role, "Ray's processes")] += cores
    out["outside the job"] = cpu["other_cores"]
    return out


def cpu_text(cpu: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in cpu_groups(cpu).items() if v >= 0.005) \
        + f" (machine busy {cpu['machine_busy_cores']:.2f})"


def alternate(cfgs: dict[str, RunConfig], out: Path, rounds: int) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {name: [] for name in cfgs}
    for r in range(rounds):
        for name, cfg in cfgs.items():
            print(f"round {r + 1}/{rounds}: {name} ...", flush=True)
            runs[name].append(run_arm(cfg, out / "arms" / name / f"round{r + 1}", name))
    return runs


def arm_entry(results: list[dict]) -> dict:
    """The last round's summary with the medians of the rounds (and each round's figure)."""
    def med(key):
        return statistics.median(r[key] for r in results)
    return {**results[-1],
            "samples_per_s": med("samples_per_s"),
            "rounds_samples_per_s": [r["samples_per_s"] for r in results],
            "summary_samples_per_s": med("summary_samples_per_s"),
            "rounds_summary_samples_per_s": [r["summary_samples_per_s"] for r in results],
            "wall_s": med("wall_s"), "train_s": med("train_s"),
            "first_step_done_s": med("first_step_done_s"), "window_s": med("window_s"),
            "worker_step_s_median": (statistics.median(r["worker_step_s_median"] for r in results)
                                     if all(r["worker_step_s_median"] for r in results) else None),
            "memory_rounds": [r["memory"] for r in results],
            "cpu_rounds": [r["cpu"] for r in results]}


def arm_entry_with_mean_auc(results: list[dict]) -> dict:
    """``arm_entry`` whose eval AUC is the mean of the rounds (each round's in
    ``auc_rounds``): single runs of the asynchronous modes scatter by a few thousandths."""
    entry = arm_entry(results)
    aucs = [r["eval"]["auc"] for r in results]
    return {**entry, "eval": {**entry["eval"], "auc": statistics.mean(aucs)},
            "auc_rounds": aucs}


def summary_rows(arms: dict, ratios: dict) -> list[list]:
    rows = [[f"{n}: samples / train_s", a["summary_samples_per_s"],
             "rounds: " + ", ".join(f"{x:,.0f}" for x in a["rounds_summary_samples_per_s"])]
            for n, a in arms.items()]
    return rows + [[k, v, "ratio of the medians above"] for k, v in ratios.items()]


def timeline_rows(arms: dict) -> list[list]:
    rows = []
    for n, a in arms.items():
        rows += [[f"{n}: wall s (whole driver.run)", a["wall_s"], ""],
                 [f"{n}: train_s of summary.json", a["train_s"],
                  "the training loop" if a["mode"] == "local" else
                  "from the first step to the poll that saw the workers done"],
                 [f"{n}: first step done at s", a["first_step_done_s"],
                  "on the training clock (from the first step): first record with samples"],
                 [f"{n}: measured window s", a["window_s"],
                  f"after the warm-up ({WARMUP_STEPS} steps per worker)"]]
    return rows


def cpu_rows(arms: dict) -> list[list]:
    """Cores each group used during the measured window, median of the rounds."""
    rows = []
    for n, a in arms.items():
        cpus = [r for r in a["cpu_rounds"] if r]
        if not cpus:
            continue
        groups = [cpu_groups(c) for c in cpus]
        med = {k: statistics.median(g[k] for g in groups) for k in groups[0]}
        busy = statistics.median(c["machine_busy_cores"] for c in cpus)
        rows.append([f"{n}: cores used by the job", statistics.median(c["job_cores"]
                                                                      for c in cpus),
                     ", ".join(f"{k} {v:.2f}" for k, v in med.items() if v >= 0.005)
                     + f"; machine busy {busy:.2f} of {os.cpu_count()}"])
    return rows


def memory_rows(arms: dict) -> list[list]:
    rows = []
    for n, a in arms.items():
        mems = a["memory_rounds"]
        peak = max(m["peak_total_rss"] for m in mems)
        top = max(mems, key=lambda m: m["peak_total_rss"])
        at_peak = top["processes_at_peak"]
        rows.append([f"{n}: job peak RSS (GB)", peak / GB,
                     f"max of {len(mems)} rounds ("
                     + ", ".join(f"{m['peak_total_rss'] / GB:.2f}" for m in mems)
                     + f"), reached {top['peak_at_s']:.0f} s into a {top['run_s']:.0f} s run; "
                     "processes at the peak: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(at_peak.items()))])
        for role in ("worker", "ps_shard", "driver"):
            peaks = [m["by_role"].get(role, {}).get("max_peak_rss") for m in mems]
            if any(peaks):
                rows.append([f"{n}: {role} peak RSS (GB)", max(p for p in peaks if p) / GB,
                             "one process, max of rounds"])
    return rows


def table_size_rows(runs: dict[int, list[dict]]) -> list[list]:
    rows = []
    for key, label in (("worker_peak_rss", "worker"), ("ps_shard_peak_rss", "PS shard"),
                       ("driver_peak_rss", "driver"), ("peak_total_rss", "whole job")):
        for n, rs in runs.items():
            values = [r["memory"][key] for r in rs]
            rows.append([f"{label} peak RSS (GB), table_rows={n:,}", max(values) / GB,
                         f"max of {len(values)} rounds ("
                         + ", ".join(f"{v / GB:.3f}" for v in values)
                         + f"), {rs[0]['samples']:,} samples each"])
    small, large = runs
    rows.append(["PS growth expected from table size (GB)", NUM_TABLES * (large - small) / GB,
                 "EmbeddingStore.initialized, one zeroed byte per row of every table; weights "
                 "and optimizer state are torch.empty, whose untouched pages hold no memory"])
    return rows
