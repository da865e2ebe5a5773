"""One trial of `recsync tune`, in the process Ray Tune runs it in: the base config with the
trial's values, trained as `recsync train` would (recsync.run.driver.run) into the trial's own
directory, each evaluation on the validation slice reported to the trial as it ends.

What a trial reports, each validation evaluation (the scheduler compares ``METRIC`` at equal
``TIME_ATTR``): ``evals`` (validation evaluations so far, from 1), ``samples`` (trained so
far), ``validation_logloss`` and ``validation_auc``. A trial that ASHA stops ends inside its
report (Ray Tune's report raises SystemExit in the trial's thread): its directory keeps
config.toml and metrics.jsonl up to the evaluation before (the one it was stopped at is in
the search's trials.json), and no summary.json.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from recsync.cluster import storage
from recsync.config import RunConfig

METRIC = "validation_logloss"  # what ASHA compares (lower is better)
TIME_ATTR = "evals"  # ASHA's clock: validation evaluations reported


def trial_config(base_toml: str, values: dict, cwd: str) -> RunConfig:
    """The base config (as TOML text) with the trial's ``values`` ({dotted key: value}) set,
    relative paths made absolute against ``cwd`` (the driver's: Ray Tune runs a trial in a
    folder of its own) and no progress bar."""
    from recsync.api import override
    cfg = RunConfig.model_validate(tomllib.loads(base_toml))
    cfg = override(cfg, **{key: plain(value) for key, value in values.items()})
    return override(with_absolute_paths(cfg, Path(cwd)), **{"output.progress": False})


def plain(value):
    """A value Tune drew (numpy scalars for some distributions) as the Python value."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) \
        else value


def with_absolute_paths(cfg: RunConfig, cwd: Path) -> RunConfig:
    """``cfg`` with its relative local paths (data.path, train.init_from, recovery.dir, a
    model builder's file) made absolute against ``cwd``; URLs and absolute paths kept."""
    from recsync.api import override

    def absolute(path: str) -> str | None:
        if not path or storage.is_url(path) or Path(path).is_absolute():
            return None
        return str((cwd / path).resolve())

    changes = {}
    for key, value in (("data.path", cfg.data.path), ("train.init_from", cfg.train.init_from),
                       ("recovery.dir", cfg.recovery.dir)):
        new = absolute(value)
        if new is not None:
            changes[key] = new
    where, sep, builder = cfg.model.name.rpartition(":")
    if sep and where.endswith(".py") and absolute(where):
        changes["model.name"] = f"{absolute(where)}:{builder}"
    return override(cfg, **changes) if changes else cfg


def report_eval(report, count: list[int]):
    """The run's ``on_eval`` hook: each validation evaluation to ``report`` (tune.report) as
    the trial's next result (``count``: evaluations so far, shared with the caller)."""

    def on_eval(result: dict) -> None:
        count[0] += 1
        loss = result.get("logloss")
        if loss is None or not math.isfinite(loss):  # ASHA cannot rank a NaN: worst instead
            loss = math.inf
        report({TIME_ATTR: count[0], "samples": int(result.get("samples") or 0),
                METRIC: float(loss), "validation_auc": result.get("auc")})

    return on_eval


def run_trial(values: dict, *, base_toml: str, trials_dir: str, cwd: str) -> None:
    """The trainable Ray Tune runs (tune.with_parameters binds the keywords): trains into
    ``trials_dir``/TRIAL_ID and reports each validation evaluation; returns when the run
    ends, raises what the run raised (the trial is then an error)."""
    from ray import tune

    from recsync.run.driver import run
    cfg = trial_config(base_toml, values, cwd)
    out = Path(trials_dir) / tune.get_context().get_trial_id()
    run(cfg, out, overwrite=True, on_eval=report_eval(tune.report, [0]))
