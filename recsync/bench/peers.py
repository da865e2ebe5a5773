"""Scenario `peers`: recsync against TorchRec on the same DLRM, data and steps.

Arms, each run once per seed (``--seeds``, default 3, ``train.seed`` = 0, 1, ...; the arms
interleaved within each seed, so that a drift of the machine hits every arm alike):

- ``local``: ``recsync train`` in mode local (``run.run``, as the command makes it);
- ``async_1w1s``: mode async on an embedded Ray instance, 1 worker, 1 PS shard;
- ``torchrec``: TorchRec's DLRM over an EmbeddingBagCollection fused with row-wise Adagrad, in
  this process, started from recsync's initial model of the seed (bench/peers_torchrec.py;
  FBGEMM's CPU kernel ignores the rows' L2 weight decay). TorchRec is an optional extra
  (scripts/install_peers.sh): where it is not installed the arm is skipped with one line, the
  recsync arms still run, and the ratios that need it are None.

Every arm: recsync's default DLRM (bottom MLP, dot interaction, top MLP, dim 16, one table per
each of the 26 features), batch 4,096, row-wise Adagrad on rows, Adagrad on dense parameters,
``train.threads`` (1) intra-op threads: recsync's defaults, so that a change of a default (a
dtype, a compiled MLP) reaches this scenario. Only output settings are changed: no evaluation
during training (local waits for each), one metrics record per step, no plot, no saved model.
One pass over the same synthetic data (SynthSpec's defaults, 147 x 4,096 training rows x
``--scale``, 100,000 eval rows), so the same steps in every arm. Throughput is measured after a
warm-up of ``overhead.WARMUP_STEPS`` steps, as in scenario `overhead`; eval AUC on the whole
eval split, recsync's metrics (scikit-learn's AUC) for every arm.

Beside the TorchRec arm only, ``local_no_row_decay``: mode local with
``train.embedding_weight_decay`` = 0, the maths the TorchRec arm runs (FBGEMM's CPU kernel
ignores the rows' L2 decay), so that the AUCs can also be compared like for like.

Ratios (of the means over seeds): ``local_vs_torchrec_speed``, ``local_minus_torchrec_auc``
(also the mean of the paired per-seed differences), ``async_1w_vs_local_speed`` and
``local_no_row_decay_minus_torchrec_auc``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from recsync.api import override
from recsync.bench import overhead as ov
from recsync.bench import peers_torchrec
from recsync.bench import seeds as sd
from recsync.config import RunConfig, load_config
from recsync.data.reader import Dataset

TORCHREC, NO_DECAY = "torchrec", "local_no_row_decay"
STEPS = 147  # one pass, x --scale: 602,112 training rows (the probe used 600k)
BATCH = 4096
EVAL_ROWS = 100_000
OUTPUT = [  # the only settings changed from recsync's defaults: what is recorded, not trained
    "train.eval_every_samples=1000000000000", "output.progress=false", "output.plot=false",
    "output.log_every_steps=1", "output.save_model=false",
]
RECSYNC_ARMS = {
    "local": ['mode="local"'],
    "async_1w1s": ['mode="async"', "cluster.workers=1", "cluster.ps_shards=1"],
    # the maths TorchRec's arm runs on a CPU, whose FBGEMM kernel ignores the rows' L2 decay:
    # its AUC against TorchRec's is the like-for-like one (run only beside the TorchRec arm)
    NO_DECAY: ['mode="local"', "train.embedding_weight_decay=0"],
}
OPTION_WORDS = {"threads", "dtype", "autocast", "compile", "precision", "bf16", "amp"}


def run(out: Path, scale: float, seeds: int = sd.DEFAULT_SEEDS) -> dict:
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    started = time.perf_counter()
    steps = max(2 * ov.WARMUP_STEPS + 2, round(STEPS * scale))
    data = ov.make_data(out / "data", steps * BATCH, 100_000, eval_rows=EVAL_ROWS)
    cfgs = {name: arm_config(data, extra) for name, extra in RECSYNC_ARMS.items()}
    skipped = peers_torchrec.missing()
    if skipped:
        print(f"peers: TorchRec is not installed here ({skipped}); its arm is skipped, the "
              f"recsync arms run. Install it with {peers_torchrec.INSTALL_HINT}.", flush=True)
    ds = None if skipped else Dataset(data)
    names = [n for n in cfgs if n != NO_DECAY] + ([] if skipped else [NO_DECAY, TORCHREC])
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for s in range(seeds):
        for name in runs:
            print(f"seed {s + 1}/{seeds}: {name} ...", flush=True)
            arm_dir = out / "arms" / name / f"seed{s}"
            cfg = override(cfgs.get(name, cfgs["local"]), **{"train.seed": s})
            runs[name].append(peers_torchrec.run_arm(cfg, ds, arm_dir, ov.WARMUP_STEPS)
                              if name == TORCHREC else ov.run_arm(cfg, arm_dir, name))
            print(f"  eval AUC {runs[name][-1]['eval']['auc']:.4f}", flush=True)
    arms = {name: arm_entry(r) for name, r in runs.items()}
    differences = ({f"{a}_minus_torchrec_auc": sd.auc_difference(arms, a, TORCHREC)
                    for a in ("local", NO_DECAY)} if TORCHREC in arms else {})
    wall_s = time.perf_counter() - started
    return {
        "scenario": "peers",
        "description": description(arms, steps, seeds, skipped, wall_s),
        "seeds": seeds,
        "speed_statistic": "mean",
        "arms": arms,
        "ratios": ratios(arms),
        "differences": differences,
        "skipped": {TORCHREC: skipped} if skipped else {},
        "wall_s": wall_s,
        "tables": {"Each arm's options": option_rows(cfgs, arms),
                   "Eval AUC per arm (mean of seeds)": sd.auc_rows(arms)
                   + [sd.difference_row(k, d) for k, d in differences.items()],
                   "Samples/s per seed (after the warm-up)": speed_rows(arms)},
        "configs": {f"{name} (recsync config, seed 0)": cfg.to_toml()
                    for name, cfg in cfgs.items() if name in arms},
    }


def arm_config(data: Path, extra: list[str]) -> RunConfig:
    return load_config(None, [f"data.path={json.dumps(str(data))}", *OUTPUT, *extra])


def arm_entry(results: list[dict]) -> dict:
    """An arm over its seeds: the last seed's summary with samples/s and the eval AUC the means
    of the seeds (each seed's in ``rounds_samples_per_s`` and ``auc_seeds``)."""
    speeds = [r["samples_per_s"] for r in results]
    aucs = [r["eval"]["auc"] for r in results]
    return {**results[-1], "samples_per_s": statistics.mean(speeds),
            "rounds_samples_per_s": speeds,
            "eval": {**results[-1]["eval"], "auc": statistics.mean(aucs)},
            "auc_seeds": aucs, "auc_stats": sd.describe(aucs)}


def ratios(arms: dict) -> dict[str, float | None]:
    """The scenario's three ratios from the arms' means; those that need the TorchRec arm are
    None where it did not run."""
    local = arms["local"]
    peer = arms.get(TORCHREC)
    return {
        "local_vs_torchrec_speed": (local["samples_per_s"] / peer["samples_per_s"]
                                    if peer else None),
        "local_minus_torchrec_auc": (local["eval"]["auc"] - peer["eval"]["auc"]
                                     if peer else None),
        "async_1w_vs_local_speed": arms["async_1w1s"]["samples_per_s"] / local["samples_per_s"],
        f"{NO_DECAY}_minus_torchrec_auc": (arms[NO_DECAY]["eval"]["auc"] - peer["eval"]["auc"]
                                           if peer and NO_DECAY in arms else None),
    }


def dense_precision_used(cfg: RunConfig) -> str:
    """What ``train.dense_precision`` resolves to on this machine's CPU (model/compute.py)."""
    import torch

    from recsync.model.compute import resolve_precision
    return resolve_precision(cfg.train.dense_precision, torch.device("cpu"))[0]


def option_rows(cfgs: dict[str, RunConfig], arms: dict) -> list[list]:
    """What each arm ran with: threads, and every train/model option about precision or
    compilation that recsync's config has (a default another change may set)."""
    rows = []
    for name, cfg in ((n, c) for n, c in cfgs.items() if n in arms):
        options = {f"{section}.{k}": v for section in ("train", "model")
                   for k, v in getattr(cfg, section).model_dump().items()
                   if OPTION_WORDS & set(k.split("_"))}
        rows.append([f"{name}: options", ", ".join(f"{k} = {v}" for k, v in options.items()),
                     "recsync's defaults (only output settings changed"
                     + (", and train.embedding_weight_decay = 0" if name == NO_DECAY else "")
                     + f"); the dense training steps ran in {dense_precision_used(cfg)} here; "
                     "parameters, rows and optimizer state float32"])
    if TORCHREC in arms:
        a = arms[TORCHREC]
        rows.append([f"{TORCHREC}: options", f"torch threads = {a['threads']}, float32",
                     f"torchrec {a['versions']['torchrec']}, fbgemm_gpu "
                     f"{a['versions']['fbgemm_gpu']}; fused EXACT_ROWWISE_ADAGRAD, eager "
                     f"dense MLPs, dense warm-up {a['dense_warmup_steps']} steps; the rows' L2 "
                     f"weight decay (train.embedding_weight_decay, asked of FBGEMM) "
                     + ("applied" if a["row_weight_decay_applied"] else
                        "NOT applied: FBGEMM's CPU kernel ignores it (measured)")])
    return rows


def speed_rows(arms: dict) -> list[list]:
    return [[name, a["samples_per_s"], "per seed: "
             + ", ".join(f"{x:,.0f}" for x in a["rounds_samples_per_s"])
             + f"; samples / train_s of the last seed {a['summary_samples_per_s']:,.0f}"]
            for name, a in arms.items()]


def description(arms: dict, steps: int, seeds: int, skipped: str | None, wall_s: float) -> str:
    text = (f"{seeds} seed(s) per arm, arms interleaved within each seed; one pass of {steps} "
            f"steps x {BATCH} samples over the same synthetic data (SynthSpec defaults, "
            f"{EVAL_ROWS:,} eval rows); recsync's default DLRM and optimizers, "
            f"1 intra-op thread per training process. samples/s counts the steps after a "
            f"warm-up of {ov.WARMUP_STEPS}; speeds and AUCs are means over seeds, ratios are "
            f"ratios of means. Not emulated: every process shares this machine's cores. "
            f"The TorchRec arm's batches are converted to KeyedJaggedTensors before timing. "
            f"Scenario wall time {wall_s / 60:.1f} min.")
    if skipped:
        text += (f" TorchRec is not installed here ({skipped}): its arm was skipped and "
                 f"local_vs_torchrec_speed and local_minus_torchrec_auc are None; install it "
                 f"with {peers_torchrec.INSTALL_HINT}.")
    return text
