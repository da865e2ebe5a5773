"""Scenario `quality`'s arithmetic and tables: an arm from its seeds' summaries, the early
stopping arm's model chosen on validation, the ratios the issue's checks read, and the
per-sample tables of report.md. Plain functions of dicts: tested without training.

A sample's results: ``{"arms": {name: arm}, "absent": {name: why}, "train_rows", ...}``.
Arm names: ``logistic_regression``, ``lightgbm``, ``constant`` (the baselines),
``defaults/<model>`` (recsync's defaults, one epoch), ``es/<model>`` (defaults with
validation and early stopping), ``tuned`` (recsync tune's chosen config, its seeds:
bench/quality_tuned.py). Every arm has ``auc`` and ``logloss`` (eval split; the mean over
seeds for recsync's),
``auc_spread`` and ``logloss_spread`` (population standard deviation over seeds; 0 for the
deterministic baselines) and ``cpu_s`` (the whole arm: every seed, or the baseline's search and
refit).
"""

from __future__ import annotations

import statistics

from recsync.bench.report import _table

DEFAULTS, ES, TUNED = "defaults/", "es/", "tuned"
BASELINES = ("logistic_regression", "lightgbm", "constant")


NOISE_AUC = 0.7  # the AUC whose standard error on a sample's eval split the overview shows


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """The standard error of an AUC measured on this many positives and negatives (Hanley and
    McNeil, 1982): how far two arms' AUCs on the same small eval split may differ by chance."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc)
           + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return var ** 0.5


def _spread(xs: list[float]) -> float:
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


def recsync_arm(summaries: list[dict], cpu_s: list[float]) -> dict:
    """An arm of recsync runs (one summary.json and CPU seconds per seed)."""
    aucs = [s["eval"]["auc"] for s in summaries]
    losses = [s["eval"]["logloss"] for s in summaries]
    arm = {"auc": statistics.mean(aucs), "logloss": statistics.mean(losses),
           "auc_seeds": aucs, "logloss_seeds": losses,
           "auc_spread": _spread(aucs), "logloss_spread": _spread(losses),
           "cpu_s": sum(cpu_s), "cpu_s_seeds": cpu_s,
           "samples_per_s": statistics.median(s["samples_per_s"] for s in summaries),
           "eval": {"auc": statistics.mean(aucs), "rows": summaries[0]["eval"]["rows"]}}
    best = [(s.get("stopped") or {}).get("best_eval") for s in summaries]
    if all(b is not None for b in best):  # a validation slice: model selection ran
        arm["validation_logloss"] = statistics.mean(b["logloss"] for b in best)
        arm["best_eval_samples"] = [b["samples"] for b in best]
        arm["stopped"] = [s["stopped"]["reason"] for s in summaries]
    return arm


def chosen_es_model(arms: dict) -> str | None:
    """The early stopping arm a user would keep: the lowest mean validation log loss (never
    the eval split's figures); None where there is none."""
    es = {n: a for n, a in arms.items() if n.startswith(ES) and "validation_logloss" in a}
    return min(es, key=lambda n: es[n]["validation_logloss"]) if es else None


def _recsync_arms(arms: dict) -> dict:
    return {n: a for n, a in arms.items() if n.startswith((DEFAULTS, ES)) or n == TUNED}


def ratios(samples: dict) -> tuple[dict, dict]:
    """(ratios, notes) over the measured samples; notes: {ratio: why it is absent, or where
    it was measured}.

    ``defaults_minus_lr_auc_min``: the lowest over samples of the chosen early stopping arm's
    eval AUC minus logistic regression's. ``tuned_minus_lgbm_auc_min``
    (``tuned_minus_lr_auc_min``): the lowest over samples of the tuned arm's minus LightGBM's
    (logistic regression's), only where every sample has both; the note says where.
    ``worst_logloss_minus_constant``: the highest over samples and recsync arms of the eval log
    loss minus the constant predictor's. ``<model>_minus_baseline_auc``: the former ratios
    (one epoch minus logistic regression) on avazu_head9k, where it was measured."""
    out, absent = {}, {}
    es_minus_lr = [a["arms"][a["es_model"]]["auc"] - a["arms"]["logistic_regression"]["auc"]
                   for a in samples.values() if a.get("es_model")
                   and a["arms"]["logistic_regression"]["auc"] is not None]
    if es_minus_lr:
        out["defaults_minus_lr_auc_min"] = min(es_minus_lr)
    else:
        absent["defaults_minus_lr_auc_min"] = "no sample with an early stopping arm"
    for ratio, baseline in (("tuned_minus_lgbm_auc_min", "lightgbm"),
                            ("tuned_minus_lr_auc_min", "logistic_regression")):
        missing = {n: a["absent"].get(TUNED) or a["absent"].get(baseline)
                   for n, a in samples.items() if TUNED not in a["arms"]
                   or baseline not in a["arms"]}
        gaps = [(a["arms"][TUNED]["auc"] - a["arms"][baseline]["auc"], n)
                for n, a in samples.items() if n not in missing
                and a["arms"][baseline]["auc"] is not None]
        if samples and not missing and gaps:
            out[ratio], where = min(gaps)
            absent[ratio] = f"at {where}"
        else:
            absent[ratio] = ("; ".join(sorted(set(filter(None, missing.values()))))
                             or "no sample measured")
    worst = [(a["logloss"] - s["arms"]["constant"]["logloss"], f"{n} {arm}")
             for n, s in samples.items() for arm, a in _recsync_arms(s["arms"]).items()]
    if worst:
        out["worst_logloss_minus_constant"], where = max(worst)
        absent["worst_logloss_minus_constant"] = f"at {where}"
    avazu = samples.get("avazu_head9k")
    if avazu:
        lr_auc = avazu["arms"]["logistic_regression"]["auc"]
        out.update({f"{n[len(DEFAULTS):]}_minus_baseline_auc": a["auc"] - lr_auc
                    for n, a in avazu["arms"].items() if n.startswith(DEFAULTS)})
    return out, absent


def _cell(a: dict, key: str) -> str:
    if a.get(key) is None:
        return "n/a (one class)"
    spread = a.get(f"{key}_spread") or 0.0
    return f"{a[key]:.4f} ± {spread:.4f}"


def _short(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _note(name: str, a: dict, fit_rows: int) -> str:
    if name == "logistic_regression":
        return f"C = {a['C']:g}"
    if name == "lightgbm":
        return f"{a['rounds']} rounds"
    if name == TUNED:
        note = f"recsync tune, {a['trials']} trials"
        if "model" in a:
            values = ", ".join(f"{k.split('.')[-1]} {_short(v)}"
                               for k, v in a.get("values", {}).items() if k != "model.name")
            note += (f", chosen {a['model']} ({values}); CPU s: search "
                     f"{a['search_cpu_s']:.1f} (whole process tree, {a['search_wall_s']:.0f} s "
                     f"wall) + seeds {a['seeds_cpu_s']:.1f}")
        else:
            note += " (CPU s: the search and the chosen config's seeds)"
        return note
    if "stopped" in a:
        epochs = statistics.mean(a["best_eval_samples"]) / max(fit_rows, 1)
        reasons = {r: a["stopped"].count(r) for r in a["stopped"]}
        return (f"validation log loss {a['validation_logloss']:.4f}; best at {epochs:.1f} "
                f"epochs (mean); stopped: "
                + ", ".join(f"{r} x{c}" for r, c in reasons.items()))
    return ""


def sample_section(name: str, s: dict) -> str:
    """One sample's heading, facts, skipped arms and table for report.md."""
    constant = s["arms"]["constant"]["logloss"]
    head = (f"### {name}\n\n{s['train_rows']:,} training rows (the last "
            f"{s['validation_rows']:,} of them the validation slice), {s['eval_rows']:,} eval "
            f"rows; train CTR {s['train_ctr']:.4f}, eval CTR {s['eval_ctr']:.4f}; preset "
            f"{s['preset']}." + (f" {s['note'][0].upper()}{s['note'][1:]}." if s["note"] else ""))
    if s.get("es_model"):
        head += (f" Early stopping arm chosen on validation log loss: "
                 f"**{s['es_model'][len(ES):]}**.")
    lines = [head, ""] + [f"- {arm}: {why}" for arm, why in s["absent"].items()]
    order = list(BASELINES) + sorted(n for n in s["arms"] if n not in BASELINES)
    fit_rows = s["train_rows"] - s["validation_rows"]
    rows = [[n, _cell(a, "auc"), _cell(a, "logloss"), f"{a['logloss'] - constant:+.4f}",
             f"{a['cpu_s']:.1f}", _note(n, a, fit_rows)]
            for n in order if (a := s["arms"].get(n)) is not None]
    return "\n".join(lines + ([""] if s["absent"] else []) + [_table(
        ["arm", "eval AUC (mean ± spread)", "eval log loss (mean ± spread)",
         "log loss - constant", "CPU s", "note"], rows)])


def overview(samples: dict) -> str:
    """One line per sample: the noise of an AUC on its eval split (auc_standard_error), LR,
    LightGBM, the chosen early stopping arm and tuned AUCs."""
    def auc(a):
        return "" if a is None or a.get("auc") is None else f"{a['auc']:.4f}"
    rows = []
    for name, s in samples.items():
        arms, es = s["arms"], s.get("es_model")
        lr = arms["logistic_regression"]["auc"]
        es_auc = arms[es]["auc"] if es else None
        positives = round(s["eval_rows"] * s["eval_ctr"])
        noise = auc_standard_error(NOISE_AUC, positives, s["eval_rows"] - positives)
        rows.append([name, f"{s['train_rows'] + s['eval_rows']:,}", f"{s['eval_ctr']:.3f}",
                     f"{noise:.3f}",
                     auc(arms["logistic_regression"]), auc(arms.get("lightgbm")),
                     f"{auc(arms.get(es))} ({es[len(ES):]})" if es else "",
                     "" if es_auc is None or lr is None else f"{es_auc - lr:+.4f}",
                     auc(arms.get(TUNED))])
    return _table(["sample", "rows", "eval CTR", f"s.e. of an AUC of {NOISE_AUC}", "LR AUC",
                   "LightGBM AUC", "defaults + early stopping AUC (model)", "minus LR", "tuned AUC"], rows)
