"""`recsync tune`: a search over config keys on Ray Tune, each trial a recsync run, ASHA
stopping the trials whose validation log loss lags at equal validation evaluations.

In order: the base config (with a validation slice: 0.1 where it has none) and the space are
read and checked; Ray starts as a run's would (cluster/ray_session.py: embedded, or the
cluster of cluster.address) and is always shut down; Ray Tune runs the trials
(recsync/tuning/trial.py), and its callback feeds the table (recsync/tuning/table.py), written
as each trial ends; at the end, or on SIGINT/SIGTERM/SIGHUP, the table, the plot and the best
config are written from the trials that reported (docs/tune.md).

Resources: a `local` trial asks Ray for train.threads CPUs (its one process), so the trials
that run at once are as many as the cluster's CPUs allow (2 on a 2-core machine); a trial of a
distributed mode asks for none itself (a nominal 0.001), since its workers and PS shards are actors that ask
for their own (cluster.worker_cpus, shard_cpus), and such trials run one at a time unless told
otherwise (``concurrent``): two of them could each hold part of the CPUs and wait forever for
the rest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from recsync.config import ConfigError, RunConfig, load_config
from recsync.modes import LOCAL
from recsync.run.signals import Interrupted, catch_signals, keep_signals_from_ray
from recsync.tuning.report import BEST, PLOT, best_config, plot_trials
from recsync.tuning.space import Param, Space, load_space
from recsync.tuning.table import LOG, TABLE_CSV, TABLE_JSON, TRIALS_DIR, TrialRow, TrialTable
from recsync.tuning.trial import METRIC, TIME_ATTR, run_trial

DEFAULT_VALIDATION = 0.1  # train.validation where the base config holds none out
INSTALL = "pip install 'recsync[tune]'"
TUNE_DIR = "ray_tune"  # OUT/ray_tune: Ray Tune's own records of the experiment
MAX_EVALS = 10_000  # ASHA's max_t: above any run's evaluations (the runs end themselves)


@dataclass
class TuneResult:
    """A finished search: its trials (table rows), the best one and where the outputs are."""

    out: Path
    trials: list[TrialRow]
    best: TrialRow | None
    best_config: Path | None
    plot: Path | None


def require_tune() -> None:
    """ModuleNotFoundError in one line where Ray Tune (ray[tune]: pandas, ...) is missing."""
    try:
        import ray.tune  # noqa: F401
    except ImportError as e:
        raise ModuleNotFoundError(f"recsync tune needs Ray Tune, which is not installed "
                                  f"({e}): {INSTALL}") from None


def with_validation(cfg: RunConfig, echo=print) -> RunConfig:
    """``cfg`` with a validation slice: ASHA compares validation log loss, so a base config
    without train.validation gets DEFAULT_VALIDATION (said on the console)."""
    if cfg.train.validation > 0:
        return cfg
    from recsync.api import override
    echo(f"train.validation is 0 in the base config: trials hold out the last "
         f"{DEFAULT_VALIDATION:g} of the training split to compare on (set it to choose)")
    return override(cfg, **{"train.validation": DEFAULT_VALIDATION})


def check_trials(space: Space, trials: int) -> int:
    """Ray Tune's num_samples: the draws of the non-grid keys, each run at every grid point."""
    if trials < 1:
        raise ValueError(f"--trials {trials}: give at least 1")
    points = space.grid_points
    if trials % points:
        raise ValueError(f"--trials {trials}: the grid keys make {points} combinations; give a "
                         f"multiple of {points} (each draw runs at every grid point)")
    return trials // points


def trial_cpus(base: RunConfig, space: Space) -> tuple[float, bool]:
    """(CPUs a trial asks for, whether some trial runs a distributed mode)."""
    from recsync.cluster.placement import NOMINAL_CPU  # (imports Ray)
    modes = set(space.values_of("mode")) if "mode" in space.keys else {base.mode}
    distributed = modes != {LOCAL}
    if distributed:  # Ray Tune refuses a trial of no resource: a nominal one, as placement's
        return NOMINAL_CPU, True
    threads = [base.train.threads]
    if "train.threads" in space.keys:
        threads += [int(v) for v in space.values_of("train.threads")]
    return float(max(threads)), False


def prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse OUT that holds an earlier search, unless ``overwrite`` (then it is emptied of it)."""
    mine = [n for n in (TABLE_JSON, TABLE_CSV, LOG, PLOT, BEST, TRIALS_DIR, TUNE_DIR)
            if (out / n).exists()]
    if mine and not overwrite:
        raise FileExistsError(f"{out} already holds a search ({', '.join(mine)}); choose another "
                              f"--out or pass --overwrite to replace it")
    for name in mine:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    (out / TRIALS_DIR).mkdir(parents=True, exist_ok=True)


def sampler(p: Param):
    """The Ray Tune distribution of one searched key (the int kinds include ``high``)."""
    from ray import tune
    low_high = p.values
    return {"loguniform": lambda: tune.loguniform(*low_high),
            "uniform": lambda: tune.uniform(*low_high),
            "int": lambda: tune.randint(low_high[0], low_high[1] + 1),
            "logint": lambda: tune.lograndint(low_high[0], low_high[1] + 1),
            "choice": lambda: tune.choice(list(p.values)),
            "grid": lambda: tune.grid_search(list(p.values))}[p.kind]()


def tune(config: RunConfig | str | Path | None, space: str | Path, trials: int,
         out: str | Path, *, overrides: tuple[str, ...] = (), concurrent: int | None = None,
         grace_period: int = 1, reduction_factor: int = 3, seed: int = 0,
         overwrite: bool = False, echo=print) -> TuneResult:
    """Search ``space`` (a TOML file, recsync/tuning/space.py) around the base ``config`` (a
    RunConfig, a TOML path or None for the defaults; ``overrides`` as `--set`) with ``trials``
    recsync runs scheduled by ASHA (``grace_period`` validation evaluations before a trial can
    be stopped, ``reduction_factor``); write the table, plot and best config into ``out``.
    ``concurrent``: at most this many trials at once (default: as the CPUs allow, one at a
    time for distributed modes); ``seed``: the draws'. Raises ConfigError or ValueError
    (nothing started) for a bad config, space or count, FileExistsError for an earlier search
    in ``out``, ModuleNotFoundError without Ray Tune, and Interrupted (the files written from
    the trials that ended) on SIGINT, SIGTERM or SIGHUP."""
    require_tune()
    if isinstance(config, RunConfig):
        from recsync.api import override
        base = override(config, *overrides)
    else:
        base = load_config(config, list(overrides))
    base = with_validation(base, echo)
    parsed = load_space(space, base)
    samples = check_trials(parsed, trials)
    if grace_period < 1 or reduction_factor < 2:
        raise ValueError(f"ASHA needs grace_period >= 1 and reduction_factor >= 2 (got "
                         f"{grace_period} and {reduction_factor})")
    if concurrent is not None and concurrent < 1:
        raise ValueError(f"--concurrent {concurrent}: give at least 1")
    out = Path(out).resolve()
    prepare_out(out, overwrite)
    table = TrialTable(out, parsed.keys, trials, echo)
    interrupted = None
    try:
        _search(base, parsed, samples, out, table, concurrent, grace_period, reduction_factor,
                seed)
    except KeyboardInterrupt as e:  # Interrupted, or Ray's plain one from a blocking call
        interrupted = e if isinstance(e, Interrupted) else Interrupted("SIGINT")
    finally:
        table.interrupted()  # the trials still running, if any; the files written
    result = _finish(base, table, out, echo)
    if interrupted is not None:
        raise interrupted
    return result


def _search(base: RunConfig, space: Space, samples: int, out: Path, table: TrialTable,
            concurrent: int | None, grace_period: int, reduction_factor: int, seed: int) -> None:
    """Ray up (cluster/ray_session.py), the trials run, Ray down: also on a signal."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from recsync.cluster.ray_session import ray_session, runtime_env_for
    cpus, distributed = trial_cpus(base, space)
    if concurrent is None and distributed:
        concurrent = 1
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, base_toml=base.to_toml(),
                             trials_dir=str(out / TRIALS_DIR), cwd=os.getcwd()),
        {"cpu": cpus})
    scheduler = ASHAScheduler(time_attr=TIME_ATTR, max_t=MAX_EVALS, grace_period=grace_period,
                              reduction_factor=reduction_factor)
    tuner = tune.Tuner(
        trainable, param_space={p.key: sampler(p) for p in space.params},
        tune_config=tune.TuneConfig(
            metric=METRIC, mode="min", scheduler=scheduler, num_samples=samples,
            # (the generator's own bound: Tune ignores max_concurrent_trials beside one)
            search_alg=BasicVariantGenerator(max_concurrent=concurrent or 0,
                                             random_state=seed)),
        run_config=tune.RunConfig(
            name=TUNE_DIR, storage_path=str(out), verbose=0,
            callbacks=[_table_callback(table)],
            failure_config=tune.FailureConfig(max_failures=0)))
    keep_signals_from_ray()
    # Tune's own SIGINT handler would end the search its way (ours raises Interrupted); its
    # reporter still prints boxes at verbose=0 (the table's lines say the progress)
    with _environ(TUNE_DISABLE_SIGINT_HANDLER="1", RAY_AIR_NEW_OUTPUT="0"), \
            catch_signals() as signals:
        with ray_session(base.cluster, runtime_env_for(base.cluster, base.model.name),
                         log_to_driver=False):
            signals.install()  # again: ray.init installed handlers of its own
            try:
                tuner.fit()
            finally:  # however it ended: Ray's shutdown is not interrupted
                signals.stopping("the search ended")


@contextlib.contextmanager
def _environ(**values: str):
    """Environment variables set for the block (Ray Tune reads these in this process), then
    as they were."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _table_callback(table: TrialTable):
    """A Ray Tune callback (in the driver, between the controller's steps) feeding ``table``."""
    from ray import tune

    class TableCallback(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            table.started(trial.trial_id, trial.config)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if METRIC in result:
                table.result(trial.trial_id, trial.config, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            table.ended(trial.trial_id, trial.config)

        def on_trial_error(self, iteration, trials, trial, **info):
            error = "the trial failed"
            with contextlib.suppress(OSError, TypeError):
                error = Path(trial.error_file).read_text() if trial.error_file else error
            table.ended(trial.trial_id, trial.config, error=error)

    return TableCallback()


def _finish(base: RunConfig, table: TrialTable, out: Path, echo) -> TuneResult:
    """The printed table, the plot and best.toml, from the trials that reported."""
    from recsync.api import save_config
    echo(table.text())
    plot = plot_trials(table, out / PLOT)
    best = table.best()
    best_path = None
    if best is not None:
        try:
            best_path = save_config(best_config(base, best.values), out / BEST)
        except (ConfigError, ValueError) as e:  # the trial ran it: not expected
            echo(f"warning: could not write {out / BEST}: {e}")
        echo(f"best: {best.trial} validation logloss {best.best_logloss:.5f}"
             + (f", eval AUC {best.eval_auc:.4f}" if best.eval_auc is not None else "")
             + f"; {', '.join(f'{k}={v}' for k, v in best.values.items())}")
    else:
        echo("no trial reported a validation evaluation: no best config")
    echo(f"outputs: {out}/{TABLE_CSV}, {TABLE_JSON}, {LOG}"
         + (f", {PLOT}" if plot else "") + (f", {BEST}" if best_path else "")
         + f", {TRIALS_DIR}/TRIAL_ID/")
    return TuneResult(out, list(table.rows.values()), best, best_path, plot)
