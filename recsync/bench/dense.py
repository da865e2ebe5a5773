"""Scenario `dense`: the dense model's compute per step, the options side by side.

The local run (``recsync train`` as a user runs it) of the default DLRM at batch 4,096, 26
tables x 16 on the synthetic data set of scenario `local` (tables up to 1M rows), one intra-op
thread, recsync's defaults otherwise, in four arms that differ in one setting each:

- ``fp32``: ``train.dense_precision = "float32"``, eager;
- ``bf16``: bfloat16 autocast of the training forward and backward (model/compute.py);
- ``compile``: float32, ``train.compile = true``;
- ``compile_bf16``: both.

Each arm runs once per seed (``--seeds``, default 3; arms interleaved within a seed) and is
compared by its median samples/s (steady state: after the first steps, compile excluded: it is
start-up) and its eval AUC, paired by seed (the same seed: the same initial model and data
order). The criterion: faster at an AUC within 0.002 of float32's.

Threads against processes (seed 0, ``train.dense_precision = "auto"``, each run's samples/s
after its first steps, as the arms above): ``threads1`` and ``threads2`` are one local run with
``train.threads`` 1 and 2; ``procs2x1`` is two local runs of one thread each at the same time,
their samples/s summed: what two workers of one thread each on this machine could reach at most
(EMULATED: two independent processes, no PS and no all-reduce between them; a real run adds
those costs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recsync.api import override
from recsync.bench import seeds as sd
from recsync.bench.overhead import WARMUP_STEPS, run_arm, steady_rate
from recsync.bench.local import TABLE_ROWS
from recsync.config import RunConfig, load_config
from recsync.data.synthetic import SynthSpec, generate
from recsync.metrics.core import read_jsonl
from recsync.model.compute import cpu_has_bf16

BATCH = 4096
ARMS = {"fp32": ("float32", False), "bf16": ("bfloat16", False),
        "compile": ("float32", True), "compile_bf16": ("bfloat16", True)}
SETTINGS = [f"train.batch_size={BATCH}", "model.embedding_dim=16", "train.threads=1",
            "train.eval_every_samples=1000000000000", "output.progress=false",
            "output.plot=false", "output.save_model=false", "output.log_every_steps=5"]


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    rows = max(round(1_000_000 * scale), 20 * BATCH)
    data = out / "data"
    print(f"generating {rows:,} synthetic rows ...", flush=True)
    generate(data, rows=rows, eval_rows=50_000, overwrite=True, progress=False,
             spec=SynthSpec(max_table_rows=TABLE_ROWS))
    base = load_config(None, [f"data.path={json.dumps(str(data))}", *SETTINGS])

    def config(name: str) -> RunConfig:
        precision, compiled = ARMS[name]
        return override(base, **{"train.dense_precision": precision, "train.compile": compiled})

    runs = sd.seeded_runs(list(ARMS), config, out, seeds)
    arms = {name: sd.seeded_entry(r) for name, r in runs.items()}
    for name, r in runs.items():  # compile time: start-up, reported beside the speed
        arms[name]["startup_s_seeds"] = [x.get("startup_s") for x in r]
    threads = _threads_against_processes(base, out)
    speed = {n: a["samples_per_s"] for n, a in arms.items()}
    diffs = {n: sd.auc_difference(arms, n, "fp32") for n in ARMS if n != "fp32"}
    ratios = {
        "bf16_vs_fp32_speed": speed["bf16"] / speed["fp32"],
        "compile_vs_eager_speed": speed["compile"] / speed["fp32"],
        "compile_bf16_vs_bf16_speed": speed["compile_bf16"] / speed["bf16"],
        "compile_bf16_vs_fp32_speed": speed["compile_bf16"] / speed["fp32"],
        "bf16_minus_fp32_auc": diffs["bf16"]["mean"],
        "compile_minus_fp32_auc": diffs["compile"]["mean"],
        "compile_bf16_minus_fp32_auc": diffs["compile_bf16"]["mean"],
        "threads2_vs_threads1_speed": threads["threads2"] / threads["threads1"],
        "procs2x1_vs_threads2_speed": threads["procs2x1"] / threads["threads2"],
    }
    # start-up over fp32's, seed by seed: compiling. Only the first compile in this process
    # compiles (later ones reuse dynamo's in-process cache); inductor's on-disk cache
    # (TORCHINDUCTOR_CACHE_DIR) may hold even the first from an earlier run
    compile_s = {n: [c - f for c, f in zip(arms[n]["startup_s_seeds"],
                                           arms["fp32"]["startup_s_seeds"])]
                 for n in ("compile", "compile_bf16")}
    return {
        "scenario": "dense",
        "seeds": seeds,
        "emulation_label": ("procs2x1 is EMULATED: two independent one-thread local runs at "
                            "once, samples/s summed (no PS, no all-reduce between them)"),
        "description": (
            f"Local runs of the default DLRM, batch {BATCH}, 26 tables x 16 (synthetic data, "
            f"{rows:,} training rows, tables up to {TABLE_ROWS:,} rows, 50,000 eval rows), "
            f"one intra-op thread, {seeds} seeds per arm; samples/s after the first steps "
            f"(median of seeds), eval AUC mean of seeds. This CPU has native bfloat16: "
            f"{cpu_has_bf16()}. Start-up over fp32's (compiling: start-up, not training "
            f"time), seed by seed: " + "; ".join(
                f"{n} " + ", ".join(f"{x:.1f} s" for x in v) for n, v in compile_s.items())
            + " (only a process's first compile compiles; inductor's on-disk cache may hold "
            "it from an earlier run)."),
        "arms": arms,
        "ratios": ratios,
        "differences": diffs,
        "threads": threads,
        "compile_startup_s": compile_s,
        "tables": {
            "AUC against fp32 (paired by seed)": [sd.difference_row(f"{n} - fp32", d)
                                                  for n, d in diffs.items()],
            "Eval AUC per arm": sd.auc_rows(arms),
            "Threads per process against processes (seed 0, train.dense_precision auto)": [
                ["threads1: 1 process x 1 thread, samples/s", threads["threads1"], ""],
                ["threads2: 1 process x 2 threads, samples/s", threads["threads2"], ""],
                ["procs2x1: 2 processes x 1 thread, samples/s summed", threads["procs2x1"],
                 "EMULATED upper bound of 2 one-thread workers: "
                 + ", ".join(f"{x:,.0f}" for x in threads["procs2x1_each"])],
            ],
        },
        "configs": {"fp32 (the other arms change train.dense_precision / train.compile)":
                    config("fp32").to_toml()},
    }


def _threads_against_processes(base: RunConfig, out: Path) -> dict:
    """samples/s of one process at 1 and 2 threads, and of two 1-thread processes at once."""
    cfg1 = override(base, **{"train.dense_precision": "auto"})
    cfg2 = override(cfg1, **{"train.threads": 2})
    print("threads: 1 process x 1 thread ...", flush=True)
    one = _arm(cfg1, out / "arms" / "threads1")
    print("threads: 1 process x 2 threads ...", flush=True)
    two = _arm(cfg2, out / "arms" / "threads2")
    print("threads: 2 processes x 1 thread, at once ...", flush=True)
    each = _processes(cfg1, [out / "arms" / "procs2x1" / f"p{i}" for i in range(2)])
    return {"threads1": one, "threads2": two, "procs2x1": sum(each), "procs2x1_each": each}


def _arm(cfg: RunConfig, out_dir: Path) -> float:
    return run_arm(cfg, out_dir, out_dir.name)["samples_per_s"]


def _processes(cfg: RunConfig, dirs: list[Path]) -> list[float]:
    """Each of ``dirs`` gets a `recsync train` of ``cfg`` in a process of its own, all at once;
    their samples/s after the first steps (``steady_rate``: start-up excluded)."""
    procs = []
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.in.toml").write_text(cfg.to_toml())
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "recsync", "train", "--config", str(d / "config.in.toml"),
             "--out", str(d / "run"), "--overwrite"], stdout=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"a procs2x1 run failed (exit {p.returncode})")
    warmup = WARMUP_STEPS * cfg.train.batch_size
    return [steady_rate(read_jsonl(d / "run" / "metrics.jsonl"), warmup)["samples_per_s"]
            for d in dirs]
