"""The `recsync simulate` command: flags to recsync.simulate (api.py), its errors in one line."""

from __future__ import annotations

import click

from recsync.cli_errors import USER_ERRORS, fail


def _factors(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    try:
        return float(low), float(high or low)
    except ValueError:
        raise click.BadParameter(f"{text!r}: LOW-HIGH, e.g. 2-5") from None


@click.command("simulate")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML config, as `recsync train` reads it (its mode, data, model, train).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one config key, as `recsync train --set`.")
@click.option("--workers", required=True, type=click.IntRange(min=1),
              help="Simulated workers (cluster.workers).")
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Simulated PS shards (default: the config's cluster.ps_shards).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Directory for config.toml, summary.json, metrics.jsonl, training.png.")
@click.option("--overwrite", is_flag=True, help="Replace the outputs of an earlier run in --out.")
@click.option("--compute-ms", type=float, default=None,
              help="One step's forward and backward at speed 1 (default: measured here first).")
@click.option("--speeds", type=click.Choice(["constant", "stragglers", "lognormal", "trace"]),
              default="constant", show_default=True, help="How fast each worker is.")
@click.option("--straggler-share", type=float, default=0.1, show_default=True,
              help="--speeds stragglers: the share of workers that are slow.")
@click.option("--straggler-factors", default="2-5", show_default=True, metavar="LOW-HIGH",
              help="--speeds stragglers: a slow worker's factor, drawn uniformly.")
@click.option("--sigma", type=float, default=0.25, show_default=True,
              help="--speeds lognormal: each worker's factor is exp(N(0, sigma)).")
@click.option("--trace", type=click.Path(dir_okay=False, exists=True), default=None,
              help="--speeds trace: a JSON list, per worker a factor or [[from_s, factor], ...].")
@click.option("--speed-seed", type=int, default=0, show_default=True,
              help="Seed of the speed draws.")
@click.option("--jitter", type=float, default=0.0, show_default=True,
              help="Each step's compute x exp(N(0, jitter)): equal workers drift apart.")
@click.option("--jitter-common", type=float, default=0.0, show_default=True,
              help="The share of the jitter's variance common to every worker (a host's "
                   "variation; one draw per step-long bin of the clock).")
@click.option("--latency-ms", type=float, default=None,
              help="One-way message latency (default: half the Ray call measured by bench ps).")
@click.option("--gbit", type=float, default=None, help="Network bandwidth (default 10 Gbit/s).")
def simulate(config_path, overrides, workers, shards, out, overwrite, compute_ms, speeds,
             straggler_share, straggler_factors, sigma, trace, speed_seed, jitter, jitter_common,
             latency_ms, gbit):
    """Run N workers and S PS shards in one process on a simulated clock, with the real
    model, shards, modes and gradients; writes a run's outputs, labelled SIMULATED."""
    from dataclasses import replace

    from recsync.api import simulate as run_simulation
    from recsync.config import load_config
    from recsync.simulation.output import console_lines
    from recsync.simulation.timing import Speeds, Timing
    try:
        low, high = _factors(straggler_factors)
        timing = Timing(compute_s=None if compute_ms is None else compute_ms / 1e3,
                        jitter=jitter, jitter_common=jitter_common,
                        speeds=Speeds(kind=speeds, share=straggler_share, low=low, high=high,
                                      sigma=sigma, trace=trace, seed=speed_seed))
        if latency_ms is not None:
            timing = replace(timing, latency_s=latency_ms / 1e3)
        if gbit is not None:
            timing = replace(timing, bytes_per_s=gbit * 1e9 / 8)
        cfg = load_config(config_path, overrides)
        result = run_simulation(cfg, out, workers=workers, shards=shards, timing=timing,
                                overwrite=overwrite)
    except USER_ERRORS as e:
        fail(e)
    for line in console_lines(result.summary, result.out):
        click.echo(line)
