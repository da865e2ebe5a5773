"""The `recsync` command: turns flags into configs and calls the library, nothing else."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Before Ray is imported (it reads this then): Ray's C++ failure handler would catch a SIGTERM
# while ray.init runs, dump a stack and abort before the run can write its summary
# (recsync/run/signals.py keep_signals_from_ray).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")

import click  # noqa: E402

from recsync.bench import SCENARIOS, SEEDED  # noqa: E402
from recsync.cli_errors import USER_ERRORS, fail, writing  # noqa: E402
from recsync.config import load_config  # noqa: E402
from recsync.data.commands import data  # noqa: E402
from recsync.run.signals import EXIT_FAILED, Interrupted, catch_signals  # noqa: E402
from recsync.simulation.command import simulate  # noqa: E402
from recsync.tuning.command import tune  # noqa: E402


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Train CTR recommendation models (DLRM) with a choice of worker synchronization."""


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML config file (defaults apply to anything it leaves out).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override one config key, e.g. --set train.batch_size=1024 (repeatable).")
@click.option("--out", type=click.Path(file_okay=False),
              help="Directory (or URL, docs/cluster.md) for config.toml, summary.json, ...")
@click.option("--overwrite", is_flag=True, help="Replace the outputs of an earlier run in --out.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False),
              help="Go on with the crashed run in this directory (its --out) from its newest "
                   "complete checkpoint, with its config.toml; --set may change "
                   "cluster.ps_shards and cluster.workers (the rows are resharded).")
@click.option("--address", default=None, metavar="ADDR",
              help="Join this Ray cluster (as `ray start --head` printed it, or \"auto\") "
                   "instead of starting a local one; same as --set cluster.address=ADDR.")
def train(config_path, overrides, out, overwrite, resume_dir, address):
    """Train a model as the config says."""
    from recsync.cluster import storage
    from recsync.distributed.errors import RunFailed
    from recsync.run.driver import run
    if resume_dir:
        if config_path or overwrite or (out and Path(out) != Path(resume_dir)):
            raise click.UsageError("--resume DIR goes on with DIR's own config.toml and "
                                   "outputs: leave out --config, --out and --overwrite (--set "
                                   "may change cluster.ps_shards, cluster.workers and the "
                                   "keys docs/recovery.md lists)")
        out = resume_dir
    elif not out:
        raise click.UsageError("Missing option '--out' (or --resume DIR).")
    if address:
        overrides = (*overrides, f"cluster.address={json.dumps(address)}")
    try:
        shown = storage.local(out)  # where the outputs are here (a URL's staging folder)
        if resume_dir:  # DIR, file://DIR or a URL (its config.toml and checkpoints fetched)
            config_path = str(storage.resume_folder(resume_dir) / "config.toml")
        with catch_signals():  # also while the run is checked and set up
            cfg = load_config(config_path, overrides)
            summary = run(cfg, out, overwrite=overwrite, resume=bool(resume_dir))
    except Interrupted as e:
        if not (shown / "summary.json").exists():
            click.echo(f"interrupted by {e.signal_name} before the run started", err=True)
            sys.exit(e.exit_code)
        _print_summary(_read_summary(shown), shown)
        click.echo(f"interrupted by {e.signal_name}: summary.json in {out} has what was done",
                   err=True)
        sys.exit(e.exit_code)
    except RunFailed as e:
        _print_summary(_read_summary(shown), shown)
        click.echo(f"error: the run failed: {e}\n(summary.json in {out} has what was done)",
                   err=True)
        sys.exit(EXIT_FAILED)
    except USER_ERRORS as e:
        fail(e)
    _print_summary(summary, shown)


def _read_summary(out) -> dict | None:
    try:
        return json.loads((Path(out) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _print_summary(summary: dict | None, out: Path) -> None:
    """Whatever the summary holds: a run stopped before its evaluation has none."""
    from recsync.modes import MODES
    if summary is None:
        return
    ev = summary["eval"]
    startup = summary.get("startup_s")
    click.echo(f"{summary['status']}: {summary['samples']:,} samples in {summary['steps']:,} "
               f"steps, {_num(summary['samples_per_s'], ',.0f')} samples/s (measured from the "
               f"first step" + (f"; start-up {startup:.1f} s)" if startup is not None else ")"))
    if ev.get("rows"):
        line = (f"eval AUC {_num(ev['auc'], '.4f')}, logloss {_num(ev['logloss'], '.4f')}, NE "
                f"{_num(ev.get('ne'), '.4f')}, calibration {_num(ev.get('calibration'), '.3f')} "
                f"on {ev['rows']:,} rows")
        if ev.get("note"):
            line += f" ({ev['note']})"
        if ev.get("bayes_auc") is not None and ev.get("auc") is not None:
            line += (f"  (Bayes-optimal: AUC {ev['bayes_auc']:.4f}, logloss "
                     f"{ev['bayes_logloss']:.4f}; gap {ev['bayes_auc'] - ev['auc']:.4f})")
        click.echo(line)
    else:
        click.echo("no evaluation (the run stopped before it)")
    emulated = []
    if summary.get("stragglers_emulated"):
        emulated.append("stragglers")
    if summary.get("network_emulated"):
        net = summary["network_emulated"]
        emulated.append(f"network delay ({net['latency_ms']:g} ms per PS call, "
                        f"{net['ms_per_mb']:g} ms per MB)")
    if summary.get("failures"):
        emulated.append(f"failures ({len(summary['failures'])} processes killed)")
    if summary.get("emulation"):
        em = summary["emulation"]
        paced = [w["compute_wall_per_cpu"] / w["expected"] for w in em["workers"]
                 if w["compute_wall_per_cpu"] and w["expected"]]
        emulated.append(em["label"].removeprefix("EMULATED ")
                        + (f" (workers' compute ran at {min(paced):.2f}-{max(paced):.2f} of "
                           f"their emulated time)" if paced else ""))
    if emulated:
        click.echo("EMULATED: " + ", ".join(emulated) + "; the figures above ran under them")
    rec = summary.get("recovery") or {}
    if rec.get("checkpoints"):
        o = rec["overhead"]
        line = (f"checkpoints: {rec['checkpoints']} rounds"
                + (f" ({rec['partial_checkpoints']} partial shard checkpoints)"
                   if rec["partial_checkpoints"] else "")
                + f", training blocked {o['checkpoint_blocked_s']:.2f} s")
        if rec["recoveries"]:
            line += (f"; {rec['kind']} recovery from {len(rec['recoveries'])} failure(s): "
                     f"{o['downtime_s']:.1f} s without training, {o['lost_work_s']:.1f} s of "
                     f"training done again, overhead {o['frac']:.1%} of training time")
            if rec["pls"]:
                line += f", PLS {rec['pls']:.4f}"
        click.echo(line)
    for facts in {m.summary_key: m for m in MODES.values() if m.summary_key}.values():
        section = summary.get(facts.summary_key)
        line = facts.console_line(section) if section else None
        if line:
            click.echo(line)
    model = summary.get("model")
    click.echo(f"outputs: {out}/summary.json, metrics.jsonl, config.toml"
               + (", training.png" if (out / 'training.png').exists() else "")
               + (f", model/ ({model['bytes'] / 2**20:,.1f} MiB, written in "
                  f"{model['write_s']:.1f} s)" if model else ""))


main.add_command(data)
main.add_command(tune)
main.add_command(simulate)


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(),
              help="Image to write (PNG, or .pdf/.svg); a directory gets plots.png in it.")
def plot(runs, out):
    """Plot loss and AUC against samples and time for one or more runs."""
    from recsync.metrics.plot import plot_runs
    target = Path(out)
    if out.endswith(("/", "\\")) or target.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        target = target / "plots.png"
    elif not target.suffix:
        target = target.with_suffix(".png")
    try:
        click.echo(f"wrote {plot_runs([Path(r) for r in runs], target)}")
    except USER_ERRORS as e:
        fail(e)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--workers", type=int, default=None,
              help="The number of workers the run should have now (within its range).")
@click.option("--drain-node", "drain_nodes", multiple=True, metavar="NODE_ID",
              help="A node (Ray node id or a prefix of one) to move the run's workers off; "
                   "no new worker goes there. May be given more than once.")
def scale(run_dir, workers, drain_nodes):
    """Change a running elastic run (cluster.workers = [min, max]): its number of workers, or
    drain a node. The run takes it up within a second (docs/cluster.md)."""
    from recsync.run.scale import ask
    try:
        request = ask(run_dir, workers, list(drain_nodes))
    except (ValueError, OSError) as e:
        fail(e)
    what = [f"{workers} workers"] if workers is not None else []
    what += [f"drain node {n}" for n in drain_nodes]
    click.echo(f"asked the run in {run_dir} for {' and '.join(what)}; its console and "
               f"metrics.jsonl say when it is done")


BUILDER_HELP = ("Only for a model of your own code: its builder, package.module:NAME or "
                "path/to/file.py:NAME, which is imported and run (name only code you trust).")


@main.command()
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="A model directory (a run's OUT/model).")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Scores to write: .parquet or .csv (column score, in input order; label "
                   "too where the input has labels).")
@click.option("--split", type=click.Choice(["eval", "train"]), default="eval",
              show_default=True, help="The split of a data set directory to score.")
@click.option("--batch-size", type=int, default=8192, show_default=True)
@click.option("--strict", is_flag=True,
              help="Raw files: stop at the first bad row (default: its score is null, and bad "
                   "rows are counted and the first ones named, as in conversion).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out (never an input).")
@click.option("--builder", metavar="BUILDER", help=BUILDER_HELP)
def predict(model_dir, inputs, out, split, batch_size, strict, overwrite, builder):
    """Score rows with a trained model: a converted data set directory (a split, in its order)
    or raw CSV/TSV/Parquet files, preprocessed as the training data was (one score per row, in
    input order)."""
    from recsync.model_dir.commands import predict_command
    with writing(out):
        predict_command(model_dir, inputs, out, split=split, batch_size=batch_size,
                        strict=strict, overwrite=overwrite, builder=builder)


@main.command("export")
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="A model directory (a run's OUT/model).")
@click.option("--format", "fmt", type=click.Choice(["torchscript", "torch-export"]),
              default="torchscript", show_default=True,
              help="torchscript: torch.jit.load(FILE); torch-export: torch.export.load(FILE) "
                   "(name it .pt2).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="File to write.")
@click.option("--max-bytes", type=int, default=2 * 2**30, show_default=True,
              help="Refuse when the tables would exceed this in the file (fixed ones "
                   "materialised in full, dynamic ones their trained rows and ids).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out.")
@click.option("--builder", metavar="BUILDER", help=BUILDER_HELP)
def export_cmd(model_dir, fmt, out, max_bytes, overwrite, builder):
    """Write a trained model as one file that scores preprocessed rows with torch alone (no
    recsync): fixed tables materialised in full, dynamic tables as their trained rows and
    sorted ids, looked up in the file (docs/serving.md)."""
    from recsync.model_dir.commands import export_command
    with writing(out):
        export_command(model_dir, out, fmt=fmt, max_bytes=max_bytes, overwrite=overwrite,
                       builder=builder)


@main.command(epilog="\b\nScenarios:\n" + "\n".join(
    f"  {name:<11} {what}" for name, what in SCENARIOS.items()))
@click.argument("scenario", type=click.Choice(list(SCENARIOS)), metavar="SCENARIO")
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="Multiply the scenario's default size (rows, steps).")
@click.option("--seeds", type=int, default=None,
              help=f"Runs per arm, train.seed 0, 1, ... ({', '.join(SEEDED)}; default 3): "
                   "quality is the mean, differences are paired by seed.")
def bench(scenario, out, scale, seeds):
    """Run every arm of a benchmark scenario side by side; write results.json and report.md."""
    from recsync.bench import run_scenario
    try:
        results = run_scenario(scenario, Path(out), scale=scale, seeds=seeds)
    except USER_ERRORS as e:
        fail(e)
    for name, value in results["ratios"].items():  # None: an arm it needs was skipped
        click.echo(f"{name} = {value:.4g}" if value is not None else f"{name} = None (skipped)")
    click.echo(f"report: {Path(out) / 'report.md'}")


@main.command()
@click.option("--out", default="runs/quickstart", show_default=True,
              type=click.Path(file_okay=False))
def quickstart(out):
    """The main job: synthetic data; an emulated cluster of 4 workers and 2 PS shards with a
    straggler in the middle third, trained in sync only and with the mode controller switching
    to gba and back."""
    from recsync.recipes import quickstart as run_quickstart
    try:
        runs = run_quickstart(Path(out))
    except USER_ERRORS as e:
        fail(e)
    auto = runs["auto"]
    bayes = auto["eval"]["bayes_auc"]
    click.echo(f"\n{'run':<12}{'status':<11}{'samples/s':>10}{'eval AUC':>10}  modes")
    for name, s in runs.items():
        click.echo(f"{name:<12}{s['status']:<11}{s['samples_per_s']:>10,.0f}"
                   f"{s['eval']['auc']:>10.4f}  " + " -> ".join(m["mode"] for m in s["modes"]))
    sync = runs["sync_only"]
    click.echo(f"auto vs sync_only: {auto['samples_per_s'] / sync['samples_per_s']:.2f}x the "
               f"samples/s, AUC {auto['eval']['auc'] - sync['eval']['auc']:+.4f} (Bayes-optimal "
               f"AUC {bayes:.4f}); samples/s are measured on the {auto['emulation']['label']} "
               f"(each paced as a machine of its own), the straggler is emulated")
    click.echo(f"outputs: {Path(out)}/sync_only/ and {Path(out)}/auto/ (summary.json, "
               f"metrics.jsonl, config.toml, training.png)")


if __name__ == "__main__":
    main()
