"""Scenario `dynamic`'s results: the dict bench/report.py writes (description, tables)."""

from __future__ import annotations

from recsync.bench import seeds as sd
from recsync.bench.dynamic_data import SHARED_DATA


def results(*, arms: dict, ratios: dict, diffs: dict, facts: dict, pull_push: dict,
            collisions: dict | None, seeds: int, configs: dict, wall_s: float) -> dict:
    f = facts
    b = f["bytes_per_row"]
    return {
        "scenario": "dynamic",
        "seeds": seeds,
        "description": (
            f"Local runs of the default DLRM, batch 4,096, 26 tables x 16, row-wise Adagrad, one "
            f"intra-op thread, {seeds} seed(s) per arm (mean eval AUC; differences paired by "
            f"seed). Synthetic data: {f['train_rows']:,} training and {f['eval_rows']:,} eval "
            f"rows, a teacher of up to {f['teacher_ids_max']:,} ids per table; fixed tables of "
            f"{f['rows']:,} rows against dynamic tables of capacity {f['capacity']:,} (the "
            f"same bytes: {b['fixed_at_R']['bytes_per_row']:.1f} x {f['rows']:,} = "
            f"{b['dynamic_at_C']['bytes_per_row']:.1f} x {f['capacity']:,}, measured). Drift: "
            f"the train split in {f['segments']} segments of new ids, read in order, the eval "
            f"split the last segment's; capacity {f['capacity']:,} (LFU, LRU) against "
            f"{f['unbounded_capacity']:,} (every id). Evaluation batches are the training "
            f"batch size in every arm: an evaluation pull is a sighting (admits, evicts). "
            f"Scenario wall time {wall_s / 60:.1f} min."),
        "arms": arms,
        "ratios": ratios,
        "differences": diffs,
        "facts": facts,
        "pull_push": pull_push,
        "collisions": collisions,
        "wall_s": wall_s,
        "tables": {
            "AUC differences (paired by seed)": [sd.difference_row(n, d)
                                                 for n, d in diffs.items()],
            "Eval AUC per arm": sd.auc_rows(arms),
            "Distinct ids per table (train split; the largest tables)": _id_rows(facts),
            "Drift: live rows, and memory of each run's own process (sampled every 0.2 s)":
                _drift_rows(arms, facts),
            "Bytes per row (dim 16, row-wise Adagrad; measured on an EmbeddingStore's arrays)":
                _bytes_rows(b),
            "Pull and push, ShardCore in process (not Ray: scenario ps measures that path)":
                _pull_push_rows(pull_push),
            "Collisions on the shared samples (recsync.data.collisions, presets)":
                _collision_rows(collisions),
        },
        "configs": {f"{n} (recsync config)": cfg.to_toml() for n, cfg in configs.items()},
    }


def _id_rows(f: dict) -> list[list]:
    fixed, dyn = f["distinct_ids"]["fixed"], f["distinct_ids"]["dynamic"]
    top = sorted(range(len(dyn)), key=lambda t: -dyn[t])[:6]
    rows = [[f"C{t + 1}: dynamic ids (= the teacher's ids seen)", dyn[t],
             f"fixed ids {fixed[t]:,} in {f['rows']:,} rows; capacity {f['capacity']:,}"]
            for t in top]
    drift = f["drift_distinct_ids"]
    big = max(range(len(drift["all"])), key=lambda t: drift["all"][t])
    rows.append([f"drift C{big + 1}: ids over train and eval", drift["all"][big],
                 f"capacity {f['capacity']:,}: the tables hold 80% of their final rows at "
                 f"train row {f['full_at_row']:,}" if f["full_at_row"] is not None
                 else "no table outgrows the capacity"])
    return rows


def _drift_rows(arms: dict, facts: dict) -> list[list]:
    rows = []
    expected = facts["expected_table_growth_after_full_mb"]
    for name in ("drift_lfu", "drift_lru", "drift_unbounded"):
        a = arms[name]
        cap = sum(t["capacity"] for t in (a.get("dynamic_tables") or {}).values())
        rows.append([f"{name}: live rows at the end (26 tables, after the final evaluation)",
                     a["live_rows_seeds"][-1], f"capacity {cap:,}; per seed "
                     + ", ".join(f"{x:,}" for x in a["live_rows_seeds"])])
        mem = a["memory_over_run_seeds"][-1]
        at = mem["at_training_fraction_mb"].values()
        rows.append([f"{name}: anonymous RSS MB at 0/25/50/75/100% of training (last seed; "
                     f"medians over {mem['window']:.0%} of training)", mem["end_mb"]["anon"],
                     ", ".join(f"{v['anon']:,.0f}" for v in at) + "; RSS with the data set's "
                     "pages: " + ", ".join(f"{v['rss']:,.0f}" for v in at)])
        growth = [g for g in a["anon_growth_after_full_mb_seeds"] if g is not None]
        if growth:
            rows.append([f"{name}: anonymous RSS growth MB once the tables are full (mean of "
                         f"seeds)", sum(growth) / len(growth),
                         f"median over the last {mem['window']:.0%} of training less the "
                         f"median from {mem['full_at_fraction']:.0%} of training on (the "
                         f"tables hold 80% of their final rows there); per seed "
                         + ", ".join(f"{g:+,.1f}" for g in growth)
                         + f"; the rows the tables take after it x bytes per row: "
                         f"{expected[name]:+,.1f}"])
    return rows


def _bytes_rows(b: dict) -> list[list]:
    rows = []
    for key, label in (("fixed", "fixed table, 1,000,000 rows"),
                       ("dynamic", "dynamic table, capacity 1,000,000, admit_after 1"),
                       ("dynamic_sketch", "dynamic table, capacity 1,000,000, admit_after 2 "
                                          "(with the sketch)"),
                       ("fixed_at_R", "fixed table of the AUC arms"),
                       ("dynamic_at_C", "dynamic table of the AUC arms")):
        x = b[key]
        rows.append([f"{label}: bytes per row", x["bytes_per_row"],
                     f"{x['rows']:,} rows; " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                        x["parts_per_row"].items())])
    return rows


def _pull_push_rows(pp: dict) -> list[list]:
    return [[f"{n}: rows/s (median)", p["rows_per_s"],
             f"{p['ms_per_call']:.2f} ms per call of {p['rows_per_call']:,} rows (min "
             f"{p['ms_min']:.2f}, max {p['ms_max']:.2f}); {p['calls']} calls, "
             f"{pp['rows']:,} rows held per table, {pp['torch_threads']} torch thread(s)"]
            for n, p in pp["points"].items()]


def _collision_rows(c: dict | None) -> list[list]:
    if c is None:
        return [["collisions", None, f"no shared samples at {SHARED_DATA}: not counted"]]
    return [[f"{name} ({x['preset']}): collisions with dynamic tables", x["dynamic"],
             f"{x['values']:,} values in {x['tables']} tables; fixed tables: {x['fixed']}"]
            for name, x in c.items()]
