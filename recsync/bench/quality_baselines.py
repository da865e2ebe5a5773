"""The baselines of scenario `quality`, on a converted data set's own rows (what recsync trains
on: the same ids, dense values and splits): a regularised logistic regression (scikit-learn),
LightGBM (the optional extra ``bench``) and the constant predictor.

Both fitted baselines choose on the same validation slice as recsync's early stopping: the last
``VALIDATION`` of the training rows in time order (data/holdout.py's arithmetic), then are
refitted on every training row with what they chose (C; the number of boosting rounds), as a
CTR team would before scoring the eval split. The eval split is scored once, at the end.

Features. Logistic regression: one-hot of every single-hot id (ids unseen in fitting ignored),
the dense columns standardised, and each multi-hot feature as a bag of its ids seen in fitting,
each weighted 1/length (the mean pooling of the presets). LightGBM: every single-hot feature
as a LightGBM categorical (its ids recoded 0..k-1 in order of value over the fitting rows; an
id unseen there is missing), the dense columns as they are, and each multi-hot feature as
``MULTI_TOP`` numeric columns (the weight 1/length of its most frequent ids in fitting) and its
length. Categoricals rather than one-hot: LightGBM groups a feature's categories in one split,
and one-hot of 20-odd features of thousands of ids would give trees mostly empty columns.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import numpy as np

from recsync.data.holdout import held_rows

VALIDATION = 0.2  # the last fraction of the training rows (time order) used to choose
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
MULTI_TOP = 32  # a multi-hot feature's most frequent ids given LightGBM as columns
LGBM_PARAMS = {"objective": "binary", "learning_rate": 0.05, "num_leaves": 31,
               "min_data_in_leaf": 20, "feature_fraction": 1.0, "bagging_fraction": 1.0,
               "num_threads": 1, "seed": 0, "deterministic": True, "force_col_wise": True,
               "verbose": -1}
LGBM_MAX_ROUNDS = 2000
LGBM_STOPPING_ROUNDS = 50  # rounds without a lower validation log loss


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and its waited-for children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def lightgbm_missing() -> str | None:
    """Why the LightGBM arm cannot run (the package is not installed), or None."""
    try:
        import lightgbm  # noqa: F401
    except ImportError as e:
        return (f"LightGBM arm skipped: lightgbm is not installed ({e}); pip install "
                f"'recsync[bench]'")
    return None


@dataclass
class Columns:
    """Rows of one split as arrays: ids [n, single-hot features], dense [n, d], labels [n], and
    per multi-hot feature (values [nnz], offsets [n + 1])."""

    ids: np.ndarray
    dense: np.ndarray
    labels: np.ndarray
    multi: list

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, start: int, stop: int) -> "Columns":
        """Rows [start, stop)."""
        multi = [(v[o[start]:o[stop]], o[start:stop + 1] - o[start]) for v, o in self.multi]
        return Columns(self.ids[start:stop], self.dense[start:stop], self.labels[start:stop],
                       multi)

    def split(self, fraction: float) -> tuple["Columns", "Columns"]:
        """(the rows kept for fitting, the last ``fraction`` held out), as train.validation
        cuts them."""
        keep = len(self) - held_rows(len(self), fraction)
        return self.rows(0, keep), self.rows(keep, len(self))


def columns(ds, split: str) -> Columns:
    """Every row of a data set's split (``ds``: recsync.data.reader.Dataset)."""
    ids, dense, labels, multi = [], [], [], None
    for chunk in ds.chunks(split, 1 << 20):
        b = ds.read(chunk)
        ids.append(b.sparse.numpy())
        dense.append(b.dense.numpy())
        labels.append(b.label.numpy())
        parts = [(v.numpy(), o.numpy()) for v, o in b.multi]
        multi = parts if multi is None else [
            (np.concatenate([v0, v]), np.concatenate([o0, o[1:] + o0[-1]]))
            for (v0, o0), (v, o) in zip(multi, parts)]
    return Columns(np.concatenate(ids), np.concatenate(dense), np.concatenate(labels),
                   multi or [])


def _codes(vocab: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``x`` in the sorted ``vocab`` and whether each is there."""
    if not len(vocab):
        return np.zeros(len(x), dtype=np.int64), np.zeros(len(x), dtype=bool)
    pos = np.minimum(np.searchsorted(vocab, x), len(vocab) - 1)
    return pos, vocab[pos] == x


def _bag(values: np.ndarray, offsets: np.ndarray, vocab: np.ndarray):
    """A multi-hot feature as a CSR matrix [n, len(vocab)]: 1/length at each known id."""
    from scipy import sparse as sp
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(n), lengths)
    weight = np.repeat(1.0 / np.maximum(lengths, 1), lengths)
    col, known = _codes(vocab, values)
    return sp.csr_matrix((weight[known], (row[known], col[known])), shape=(n, len(vocab)))


def _metrics(labels: np.ndarray, p: np.ndarray) -> dict:
    from sklearn.metrics import log_loss, roc_auc_score
    auc = float(roc_auc_score(labels, p)) if 0 < labels.sum() < len(labels) else None
    return {"auc": auc, "logloss": float(log_loss(labels, p, labels=[0, 1]))}


class OneHot:
    """Logistic regression's features, fitted on some rows (module docstring)."""

    def __init__(self, fit: Columns):
        from sklearn.preprocessing import OneHotEncoder, StandardScaler
        self.enc = OneHotEncoder(handle_unknown="ignore").fit(fit.ids)
        self.scaler = StandardScaler().fit(fit.dense) if fit.dense.shape[1] else None
        self.vocabs = [np.unique(v) for v, _ in fit.multi]

    def __call__(self, c: Columns):
        from scipy import sparse as sp
        parts = [self.enc.transform(c.ids)]
        if self.scaler is not None:
            parts.append(sp.csr_matrix(self.scaler.transform(c.dense)))
        parts += [_bag(v, o, vocab) for (v, o), vocab in zip(c.multi, self.vocabs)]
        return sp.hstack(parts).tocsr()


def logistic_baseline(train: Columns, eval_: Columns) -> dict:
    """Logistic regression (L2, lbfgs), C picked from C_GRID by validation log loss, refitted
    on every training row; its eval AUC, log loss, CPU seconds and choice."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    started, cpu0 = time.perf_counter(), cpu_s()

    def fit(rows: Columns, c: float):
        features = OneHot(rows)
        model = LogisticRegression(C=c, max_iter=2000).fit(features(rows), rows.labels)
        return lambda x: model.predict_proba(features(x))[:, 1]

    fitting, valid = train.split(VALIDATION)
    by_c = {c: float(log_loss(valid.labels, fit(fitting, c)(valid), labels=[0, 1]))
            for c in C_GRID}
    best = min(by_c, key=by_c.get)
    p = fit(train, best)(eval_)
    return {**_metrics(eval_.labels, p), "C": best,
            "validation_logloss_by_C": {str(c): v for c, v in by_c.items()},
            "cpu_s": cpu_s() - cpu0, "wall_s": time.perf_counter() - started}


class TreeFeatures:
    """LightGBM's features, fitted on some rows (module docstring): a float matrix and the
    indices of its categorical columns."""

    def __init__(self, fit: Columns):
        self.vocabs = [np.unique(fit.ids[:, j]) for j in range(fit.ids.shape[1])]
        self.tops = []
        for v, _ in fit.multi:
            ids, counts = np.unique(v, return_counts=True)
            self.tops.append(np.sort(ids[np.argsort(-counts, kind="stable")[:MULTI_TOP]]))
        self.categorical = list(range(len(self.vocabs)))

    def __call__(self, c: Columns) -> np.ndarray:
        cols = []
        for j, vocab in enumerate(self.vocabs):
            code, known = _codes(vocab, c.ids[:, j])
            cols.append(np.where(known, code, np.nan))
        cols += list(c.dense.T.astype(np.float64))
        for (v, o), top in zip(c.multi, self.tops):
            cols += list(_bag(v, o, top).toarray().T)
            cols.append(np.diff(o).astype(np.float64))
        return np.stack(cols, 1) if cols else np.zeros((len(c), 0))


def lightgbm_baseline(train: Columns, eval_: Columns) -> dict:
    """LightGBM (LGBM_PARAMS), its rounds chosen by early stopping on the validation slice's
    log loss (at most LGBM_MAX_ROUNDS, LGBM_STOPPING_ROUNDS rounds of patience), refitted on
    every training row with that many rounds; its eval AUC, log loss, CPU seconds and rounds.
    ImportError where lightgbm is not installed (lightgbm_missing says so first)."""
    import lightgbm as lgb
    started, cpu0 = time.perf_counter(), cpu_s()
    fitting, valid = train.split(VALIDATION)
    features = TreeFeatures(fitting)

    def dataset(rows: Columns, f: TreeFeatures, reference=None):
        return lgb.Dataset(f(rows), rows.labels, categorical_feature=f.categorical,
                           reference=reference, free_raw_data=False)

    fit_set = dataset(fitting, features)
    booster = lgb.train(LGBM_PARAMS, fit_set, num_boost_round=LGBM_MAX_ROUNDS,
                        valid_sets=[dataset(valid, features, fit_set)], valid_names=["valid"],
                        callbacks=[lgb.early_stopping(LGBM_STOPPING_ROUNDS, verbose=False)])
    rounds = max(1, booster.best_iteration)
    valid_logloss = float(booster.best_score["valid"]["binary_logloss"])
    features = TreeFeatures(train)
    final = lgb.train(LGBM_PARAMS, dataset(train, features), num_boost_round=rounds)
    p = final.predict(features(eval_))
    return {**_metrics(eval_.labels, p), "rounds": rounds, "validation_logloss": valid_logloss,
            "cpu_s": cpu_s() - cpu0, "wall_s": time.perf_counter() - started}


def constant_baseline(train: Columns, eval_: Columns) -> dict:
    """Every eval row scored with the training click rate."""
    from sklearn.metrics import log_loss
    p = np.full(len(eval_), float(train.labels.mean()))
    return {"auc": 0.5, "logloss": float(log_loss(eval_.labels, p, labels=[0, 1])),
            "cpu_s": 0.0}
