"""The `recsync tune` command: flags to recsync.tuning.tune, its errors in one line."""

from __future__ import annotations

import sys

import click

from recsync.cli_errors import USER_ERRORS, fail
from recsync.run.signals import Interrupted


@click.command("tune")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Base TOML config of every trial (defaults apply to anything it leaves out).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one key of the base config, as `recsync train --set`.")
@click.option("--space", "space_path", required=True, type=click.Path(dir_okay=False),
              help='Search space TOML: config keys and how each is drawn, e.g. '
                   '"train.dense_lr" = {loguniform = [1e-4, 1e-1]} (docs/tune.md).')
@click.option("--trials", required=True, type=int, help="Number of trials (recsync runs).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory for the table (trials.csv, trials.json), tune.log, "
                   "validation.png, best.toml and each trial's run (trials/TRIAL_ID).")
@click.option("--concurrent", type=int, default=None,
              help="At most this many trials at once (default: as many as the CPUs allow; "
                   "one at a time for distributed modes).")
@click.option("--grace", "grace_period", type=int, default=1, show_default=True,
              help="ASHA: validation evaluations a trial runs before it can be stopped.")
@click.option("--reduction-factor", type=int, default=3, show_default=True,
              help="ASHA: 1 in this many trials goes on at each rung.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draws.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier search in --out.")
def tune(config_path, overrides, space_path, trials, out, concurrent, grace_period,
         reduction_factor, seed, overwrite):
    """Search config keys with Ray Tune: each trial a recsync run of the base config, ASHA
    stopping trials whose validation log loss lags; writes a table, a plot and best.toml
    (ready for `recsync train --config`)."""
    from recsync.tuning import tune as run_tune
    try:
        run_tune(config_path, space_path, trials, out, overrides=tuple(overrides),
                 concurrent=concurrent, grace_period=grace_period,
                 reduction_factor=reduction_factor, seed=seed, overwrite=overwrite,
                 echo=click.echo)
    except Interrupted as e:
        click.echo(f"interrupted by {e.signal_name}: {out} holds the trials that ended "
                   f"(trials.csv, trials.json)", err=True)
        sys.exit(e.exit_code)
    except (*USER_ERRORS, ImportError) as e:
        fail(e)
