"""Scenario `quality`: every built-in model against the baselines a CTR team tries first, on
every real sample of the shared sample data.

Samples (bench/quality_samples.py): each folder of ``$RECSYNC_SHARED_DATA``, else
``../shared/data`` beside the repository, converted with its shipped preset (avazu, criteo,
criteo_csv, movielens, taobao) and that preset's split. A sample that is absent, or has no
label column (the Kaggle Criteo test file), is skipped with a line saying why.

Arms, per sample, in one run:
- baselines (bench/quality_baselines.py): scikit-learn's logistic regression (C tuned) and
  LightGBM (rounds by early stopping; the optional extra ``bench``, skipped with a line where it
  is not installed), both choosing on the last ``VALIDATION`` of the training rows in time order
  and refitted on all of them; the constant predictor (the training click rate).
- ``defaults/<model>``: each built-in model (``MODELS``) with its default settings, mode local,
  one epoch, batch ``BATCH`` (the default of 4,096 would give a handful of steps on these
  samples), seeds ``SEEDS``.
- ``es/<model>``: the same with ``train.validation = VALIDATION`` (the same slice the baselines
  choose on, never trained on), ``train.epochs = ES_EPOCHS`` as a maximum, ``train.patience =
  ES_PATIENCE`` evaluations, ``EVALS_PER_EPOCH`` evaluations an epoch; the best evaluation's
  model is kept and scored on the eval split. The model a user would keep is the one with the
  lowest mean validation log loss (the eval split plays no part in the choice).
- ``tuned`` (bench/quality_tuned.py): ``recsync.tune`` with N trials (16;
  ``$RECSYNC_QUALITY_TUNE_TRIALS`` sets N, 0 turns the arm off) over its default search space
  (model.name one of dlrm, dcn, deepfm; dense and embedding learning rates and weight decays
  log-uniform; dropout; batch 32-256) around the early stopping arm's config, ASHA on the
  validation log loss with a grace of one epoch; then the chosen config (best.toml) trained
  with ``SEEDS`` as the other recsync arms, its mean eval AUC and log loss. Its CPU seconds
  are the search's (the whole process tree: Ray's processes and the trials) plus the seeds'.
  Without Ray Tune it is absent with the reason; ``run``'s ``tuned`` argument replaces it (a
  test's fake, or None for none).

Every arm's CPU seconds (user + system, the whole arm) are recorded beside its AUC and log loss.
Checks read ``ratios.tuned_minus_lgbm_auc_min`` and ``tuned_minus_lr_auc_min`` (the lowest over
samples of the tuned arm's eval AUC minus LightGBM's, logistic regression's).
Ratios and tables: bench/quality_report.py. --scale does not apply (the samples are fixed).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Callable

from recsync.bench.quality_baselines import (VALIDATION, columns, constant_baseline, cpu_s,
                                             lightgbm_baseline, lightgbm_missing,
                                             logistic_baseline)
from recsync.bench.quality_report import (DEFAULTS, ES, TUNED, chosen_es_model, overview,
                                          ratios, recsync_arm, sample_section)
from recsync.bench.quality_samples import Sample, available, convert_sample, shared_data_dir

__all__ = ["run", "shared_data_dir", "tuned_absent_reason"]

SEEDS = (0, 1, 2)
BATCH = 256
ES_EPOCHS = 10  # train.epochs of the early stopping arm: a maximum
ES_PATIENCE = 4  # evaluations without a lower validation log loss: one epoch
EVALS_PER_EPOCH = 4

# tuned(sample, data set path, output folder) -> the tuned arm: recsync_arm() of the chosen
# config's seeds, with "trials" (N) added and "cpu_s" covering the search and the seeds.
Tuned = Callable[[Sample, Path, Path], dict]
DEFAULT = "default"  # run's tuned argument: bench/quality_tuned.py's arm, unless unavailable


def tuned_absent_reason() -> str:
    """Why there is no tuned arm when ``run`` is given none."""
    import recsync
    if not hasattr(recsync, "tune"):
        return ("recsync tune is not in this build (issue 35 item 2): no tuned arm, and "
                "tuned_minus_lgbm_auc_min is not written")
    return ("scenario quality was run without a tuned arm (quality.run's tuned argument): "
            "tuned_minus_lgbm_auc_min is not written")


def _default_tuned() -> tuple[Tuned | None, str | None]:
    """(the default tuned arm, None) or (None, why there is none)."""
    from recsync.bench import quality_tuned
    why = quality_tuned.unavailable()
    return (None, why) if why else (quality_tuned.tuned_arm, None)


def _say(line: str) -> None:
    print(f"quality: {line}", file=sys.stderr, flush=True)


def _configs(data: Path, fit_rows: int):
    """(the defaults arm's config, the early stopping arm's) for the data set at ``data``."""
    import recsync
    base = recsync.override(recsync.load_config(), **{
        "data.path": str(data), "train.batch_size": BATCH, "train.epochs": 1,
        "output.progress": False, "output.plot": False, "output.save_model": False})
    es = recsync.override(base, **{
        "train.validation": VALIDATION, "train.patience": ES_PATIENCE,
        "train.epochs": ES_EPOCHS,
        "train.eval_every_samples": max(1, math.ceil(fit_rows / EVALS_PER_EPOCH))})
    return base, es


def _recsync_arm(cfg, model: str, out: Path, per_seed: list) -> dict:
    import recsync
    summaries, cpus = [], []
    for seed in SEEDS:
        c0 = cpu_s()
        r = recsync.train(recsync.override(cfg, **{"model.name": model, "train.seed": seed}),
                          out / f"seed{seed}", overwrite=True)
        cpus.append(cpu_s() - c0)
        summaries.append(r.summary)
        per_seed.append([str(out), seed, r.summary["eval"]["auc"], r.summary["eval"]["logloss"],
                         cpus[-1], (r.summary.get("stopped") or {}).get("reason")])
    return recsync_arm(summaries, cpus)


def measure_sample(sample: Sample, data: Path, out: Path, tuned: Tuned | None,
                   per_seed: list, tuned_absent: str | None = None) -> dict:
    """Every arm on one converted sample (module docstring)."""
    from recsync.data.holdout import held_rows
    from recsync.data.reader import Dataset
    from recsync.model.registry import MODELS

    ds = Dataset(data)
    train, eval_ = columns(ds, "train"), columns(ds, "eval")
    held = held_rows(len(train), VALIDATION)
    arms = {"constant": constant_baseline(train, eval_),
            "logistic_regression": logistic_baseline(train, eval_)}
    absent = {}
    missing = lightgbm_missing()
    if missing:
        absent["lightgbm"] = missing
    else:
        arms["lightgbm"] = lightgbm_baseline(train, eval_)
    base, es = _configs(data, len(train) - held)
    for model in MODELS:
        arms[DEFAULTS + model] = _recsync_arm(base, model, out / "defaults" / model, per_seed)
        arms[ES + model] = _recsync_arm(es, model, out / "es" / model, per_seed)
    if tuned is None:
        absent[TUNED] = tuned_absent or tuned_absent_reason()
    else:
        arms[TUNED] = tuned(sample, data, out / "tuned")
    return {"preset": sample.preset, "files": list(sample.files), "note": sample.note,
            "train_rows": len(train), "validation_rows": held, "eval_rows": len(eval_),
            "train_ctr": float(train.labels.mean()), "eval_ctr": float(eval_.labels.mean()),
            "arms": arms, "absent": absent, "es_model": chosen_es_model(arms),
            "configs": {"defaults": base.to_toml(), "es": es.to_toml()}}


def run(out: Path, scale: float, tuned: Tuned | None | str = DEFAULT) -> dict:
    import recsync
    started, cpu0 = time.perf_counter(), cpu_s()
    root = shared_data_dir()
    measured, skipped = available(root)
    for name, why in skipped.items():
        _say(f"{name}: skipped: {why}")
    if not measured:
        raise FileNotFoundError(f"{root}: no sample of the shared data is there (set "
                                f"RECSYNC_SHARED_DATA to the shared sample data directory)")
    tuned_absent = None
    if tuned == DEFAULT:
        tuned, tuned_absent = _default_tuned()
        if tuned_absent:
            _say(f"tuned: {tuned_absent}")
    samples, per_seed = {}, []
    for i, sample in enumerate(measured):
        _say(f"{sample.name}: converting with preset {sample.preset}, then every arm")
        data = convert_sample(sample, root, out / "data" / sample.name)
        if i == 0:  # the process's first run pays imports and first calls: not an arm's CPU
            recsync.train(_configs(data, 1)[0], out / "warmup", overwrite=True)
        samples[sample.name] = measure_sample(sample, data, out / "arms" / sample.name,
                                              tuned, per_seed, tuned_absent)
    values, notes = ratios(samples)
    wall_s = time.perf_counter() - started
    return {
        "scenario": "quality",
        "description": _description(samples, skipped, notes, wall_s, cpu_s() - cpu0),
        # the arms' table and throughput plot: the largest sample's recsync arms (the other
        # samples take a handful of steps, their speed says nothing)
        "arms": {f"{measured[0].name} {n}": a
                 for n, a in samples[measured[0].name]["arms"].items() if "samples_per_s" in a},
        "ratios": values,
        "ratio_notes": notes,
        "samples": samples,
        "skipped": skipped,
        "wall_s": wall_s,
        "tables": {},
        "per_seed": [dict(zip(("arm", "seed", "auc", "logloss", "cpu_s", "stopped"), row))
                     for row in per_seed],
        "configs": {f"{kind} arm (model.name and train.seed vary; {measured[0].name})": text
                    for kind, text in samples[measured[0].name]["configs"].items()},
    }


def _description(samples: dict, skipped: dict, notes: dict, wall_s: float,
                 cpu_total_s: float) -> str:
    seeds = ", ".join(map(str, SEEDS))
    lines = [
        f"Every real sample of the shared data, converted with its shipped preset and that "
        f"preset's split. recsync: every built-in model with default settings, mode local, "
        f"batch {BATCH}, seeds {seeds} (mean ± spread, population standard deviation over "
        f"seeds): `defaults/<model>` one epoch; `es/<model>` with train.validation = "
        f"{VALIDATION}, train.patience = {ES_PATIENCE}, train.epochs = {ES_EPOCHS} (a maximum), "
        f"{EVALS_PER_EPOCH} evaluations an epoch, the best model kept; the early stopping "
        f"model a user would keep is the lowest mean validation log loss. Baselines on the "
        f"same rows: logistic regression (scikit-learn, C by validation log loss) and LightGBM "
        f"(categorical ids, rounds by early stopping on validation log loss), each choosing on "
        f"the same last {VALIDATION:.0%} of the training rows and refitted on all of them; the "
        f"constant predictor is the training click rate. `tuned`: recsync tune (Ray Tune, "
        f"ASHA on validation log loss, grace one epoch) over bench/quality_tuned.py's space "
        f"(model.name of dlrm, dcn, deepfm; learning rates, weight decays, dropout, batch) "
        f"around the early stopping arm's config, then the chosen config with seeds {seeds}. "
        f"CPU s: the whole arm (recsync: its {len(SEEDS)} seeds; a baseline: its search and "
        f"refit; tuned: the search's whole process tree, Ray's processes included, plus its "
        f"seeds). --scale does not apply. Scenario wall time {wall_s / 60:.1f} min, CPU "
        f"{cpu_total_s / 60:.1f} min (this process and the children it waited for: the "
        f"searches' Ray workers only in part; their rows have their own).", ""]
    lines += [f"- skipped {name}: {why}" for name, why in skipped.items()]
    lines += [f"- ratio {name}: {why}" for name, why in notes.items()]
    lines += ["", "## Samples", "", overview(samples), ""]
    for name, s in samples.items():
        lines += [sample_section(name, s), ""]
    return "\n".join(lines)
