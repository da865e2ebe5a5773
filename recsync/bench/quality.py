"""Scenario `quality`: every built-in model against the baselines a CTR team tries first, on
real data: a regularised logistic regression (scikit-learn) and the constant predictor.

Data: the Avazu sample ``avazu_head9k`` of the shared sample data (8,999 rows of the first hour
of Avazu's train.csv), converted with the shipped ``avazu`` preset: time-ordered, the last 20% of
rows held out. Where the samples are: ``$RECSYNC_SHARED_DATA``, else ``../shared/data`` beside the
repository.

recsync arms: each built-in model (``MODELS``) with its default settings (model, optimizers,
learning rates, regularisation), mode local, one epoch (CTR models are trained for one; a second
one memorises a sample this small), batch ``BATCH`` (the default of 4,096 would give 2 steps on
7,200 rows), seeds 0, 1 and 2; eval AUC and log loss on the whole held-out split, mean and spread
(population standard deviation) over seeds.

Baseline: scikit-learn's LogisticRegression (L2, lbfgs) on the same converted rows: one-hot of
every categorical id (ids unseen in training ignored) and the dense columns standardised; C
picked from ``C_GRID`` by log loss on a validation slice (the last 20% of the training rows, in
time order), then refitted on all training rows. It is deterministic: the seeds do not change it
(its spread is 0). The constant predictor scores every row with the training click rate.

Ratios: ``dlrm_minus_baseline_auc`` and ``dcn_minus_baseline_auc`` (means over seeds; target:
>= 0), ``worst_logloss_minus_constant`` (the highest model mean log loss minus the constant
predictor's; target: < 0), and each model's ``<model>_minus_baseline_auc``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np

from recsync.bench.report import _table

SEEDS = (0, 1, 2)
BATCH = 256
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
SAMPLE = Path("avazu_head9k") / "avazu_train_head9k.csv"


def shared_data_dir() -> Path:
    """Where the shared sample data lives: $RECSYNC_SHARED_DATA, else ../shared/data beside the
    repository."""
    env = os.environ.get("RECSYNC_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def _columns(ds, split: str):
    """(one-hot-able ids [n, features], dense [n, d], labels [n]) of a whole split."""
    ids, dense, labels = [], [], []
    for chunk in ds.chunks(split, 1 << 20):
        b = ds.read(chunk)
        ids.append(b.sparse.numpy())
        dense.append(b.dense.numpy())
        labels.append(b.label.numpy())
    return np.concatenate(ids), np.concatenate(dense), np.concatenate(labels)


def logistic_baseline(ds) -> dict:
    """Regularised logistic regression with C picked on a validation slice of train."""
    from scipy import sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    tr_ids, tr_dense, tr_y = _columns(ds, "train")
    ev_ids, ev_dense, ev_y = _columns(ds, "eval")

    def fit(ids, dense, y, c):
        enc = OneHotEncoder(handle_unknown="ignore").fit(ids)
        scaler = StandardScaler().fit(dense) if dense.shape[1] else None

        def features(i, d):
            parts = [enc.transform(i)]
            if scaler is not None:
                parts.append(sp.csr_matrix(scaler.transform(d)))
            return sp.hstack(parts).tocsr()
        model = LogisticRegression(C=c, max_iter=2000).fit(features(ids, dense), y)
        return lambda i, d: model.predict_proba(features(i, d))[:, 1]

    cut = int(len(tr_y) * 0.8)
    scores = {}
    for c in C_GRID:
        predict = fit(tr_ids[:cut], tr_dense[:cut], tr_y[:cut], c)
        scores[c] = log_loss(tr_y[cut:], predict(tr_ids[cut:], tr_dense[cut:]), labels=[0, 1])
    best = min(scores, key=scores.get)
    p = fit(tr_ids, tr_dense, tr_y, best)(ev_ids, ev_dense)
    constant = np.full(len(ev_y), tr_y.mean())
    return {"auc": float(roc_auc_score(ev_y, p)), "logloss": float(log_loss(ev_y, p)),
            "C": best, "validation_logloss_by_C": {str(c): v for c, v in scores.items()},
            "constant_logloss": float(log_loss(ev_y, constant, labels=[0, 1])),
            "train_rows": len(tr_y), "eval_rows": len(ev_y), "eval_ctr": float(ev_y.mean())}


def _spread(xs: list[float]) -> float:
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


def run(out: Path, scale: float) -> dict:
    import recsync
    from recsync.model.registry import MODELS

    started = time.perf_counter()
    source = shared_data_dir() / SAMPLE
    if not source.is_file():
        raise FileNotFoundError(f"{source}: the Avazu sample is not there (set "
                                f"RECSYNC_SHARED_DATA to the shared sample data directory)")
    data = out / "data"
    recsync.convert([source], data, preset="avazu", overwrite=True, progress=False)
    from recsync.data.reader import Dataset
    baseline = logistic_baseline(Dataset(data))
    base = recsync.override(recsync.load_config(), **{
        "data.path": str(data), "train.batch_size": BATCH, "train.epochs": 1,
        "output.progress": False, "output.plot": False})
    arms, per_seed = {}, []
    for name in MODELS:
        results = []
        for seed in SEEDS:
            cfg = recsync.override(base, **{"model.name": name, "train.seed": seed})
            r = recsync.train(cfg, out / "arms" / name / f"seed{seed}", overwrite=True)
            results.append(r.summary)
            per_seed.append([name, seed, r.eval["auc"], r.eval["logloss"],
                             r.summary["samples_per_s"]])
        aucs = [s["eval"]["auc"] for s in results]
        losses = [s["eval"]["logloss"] for s in results]
        arms[name] = {"samples_per_s": statistics.median(s["samples_per_s"] for s in results),
                      "eval": {"auc": statistics.mean(aucs), "logloss": statistics.mean(losses),
                               "rows": results[0]["eval"]["rows"]},
                      "auc_seeds": aucs, "logloss_seeds": losses,
                      "auc_spread": _spread(aucs), "logloss_spread": _spread(losses)}
    ratios = {f"{n}_minus_baseline_auc": a["eval"]["auc"] - baseline["auc"]
              for n, a in arms.items()}
    ratios["worst_logloss_minus_constant"] = (max(a["eval"]["logloss"] for a in arms.values())
                                              - baseline["constant_logloss"])
    table = _table(
        ["model", "eval AUC (mean ± spread)", "AUC - baseline", "eval log loss (mean ± spread)",
         "log loss - constant"],
        [[n, f"{a['eval']['auc']:.4f} ± {a['auc_spread']:.4f}",
          f"{a['eval']['auc'] - baseline['auc']:+.4f}",
          f"{a['eval']['logloss']:.4f} ± {a['logloss_spread']:.4f}",
          f"{a['eval']['logloss'] - baseline['constant_logloss']:+.4f}"]
         for n, a in arms.items()]
        + [["logistic regression (scikit-learn, C = " + f"{baseline['C']:g})",
            f"{baseline['auc']:.4f}", "", f"{baseline['logloss']:.4f}",
            f"{baseline['logloss'] - baseline['constant_logloss']:+.4f}"],
           ["constant (train CTR)", "0.5", "", f"{baseline['constant_logloss']:.4f}", ""]])
    wall_s = time.perf_counter() - started
    return {
        "scenario": "quality",
        "description": (
            f"{source.name} ({baseline['train_rows']:,} training rows, the last "
            f"{baseline['eval_rows']:,} held out in time order, eval CTR "
            f"{baseline['eval_ctr']:.4f}), preset avazu. Every built-in model with default "
            f"settings, mode local, 1 epoch, batch {BATCH}, seeds {', '.join(map(str, SEEDS))}; "
            f"mean ± spread (population standard deviation) over seeds. Baseline: "
            f"scikit-learn logistic regression, C = {baseline['C']:g} picked by validation log "
            f"loss on the last 20% of the training rows. --scale does not apply (the sample is "
            f"fixed). Scenario wall time {wall_s / 60:.1f} min.\n\n## Models and baselines\n\n"
            + table),
        "arms": arms,
        "ratios": ratios,
        "baseline": baseline,
        "wall_s": wall_s,
        "tables": {"Per seed (model, seed: AUC, log loss, samples/s)": [
            [f"{n}, seed {s}", auc, f"log loss {loss:.4f}, {sps:,.0f} samples/s"]
            for n, s, auc, loss, sps in per_seed]},
        "configs": {"recsync arms (model.name and train.seed vary)": base.to_toml()},
    }
