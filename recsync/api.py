"""recsync from Python: configs (load, override, save), ``train``, ``convert``,
``load_model`` (a run's trained model, to score rows: docs/serving.md) and ``tune`` (a search
on Ray Tune: docs/tune.md).

    import recsync
    cfg = recsync.load_config("run.toml", ["mode=\\"gba\\""])     # or recsync.load_config()
    cfg = recsync.override(cfg, **{"train.batch_size": 1024, "cluster.workers": 2})
    result = recsync.train(cfg, out="runs/first")
    result.summary["eval"]["auc"], result.out / "metrics.jsonl"
    model = recsync.load_model(result.out / "model")              # a torch module

The same calls the `recsync` command makes: the same checks, outputs and endings (a run stopped
by Ctrl-C raises KeyboardInterrupt after writing its summary).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from recsync.config import ConfigError, RunConfig, _format_errors, apply_overrides
from recsync.config import load_config  # noqa: F401 (recsync.load_config)


def override(cfg: RunConfig, *overrides: str, **keys) -> RunConfig:
    """A copy of ``cfg`` with ``--set``-style overrides (``"train.batch_size=1024"``) and keys
    given as Python values (``**{"cluster.workers": 2}``), checked as a config file would be."""
    tree = apply_overrides(cfg.model_dump(exclude_none=True), list(overrides))
    for key, value in keys.items():
        node, *path = tree, *key.split(".")
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key}: {part} is not a section")
        node[path[-1]] = value
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:  # worded as load_config words it
        items = [*overrides, *(f"{k}={v!r}" for k, v in keys.items())]
        raise ConfigError(_format_errors(e, "override " + " ".join(items))) from None


def save_config(cfg: RunConfig, path: str | Path) -> Path:
    """Write ``cfg`` as TOML (what `recsync train --config` reads)."""
    path = Path(path)
    path.write_text(cfg.to_toml())
    return path


@dataclass
class RunResult:
    """A finished run: its summary.json as a dict, and where its outputs are."""

    summary: dict
    out: Path

    @property
    def status(self) -> str:
        return self.summary["status"]

    @property
    def eval(self) -> dict | None:
        return self.summary.get("eval")

    def metrics(self) -> list[dict]:
        """metrics.jsonl's records."""
        with open(self.out / "metrics.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]


def train(config: RunConfig | str | Path | None = None, out: str | Path = "runs/python", *,
          overwrite: bool = False) -> RunResult:
    """Train as ``config`` says (a RunConfig, a TOML path, or None for the defaults) and write
    the run's outputs into ``out``. Raises what `recsync train` reports: ConfigError or
    ValueError before anything is written, FileExistsError for an earlier run in ``out``,
    RunFailed (summary written) if the run could not go on."""
    from recsync.run.driver import run
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    summary = run(cfg, out, overwrite=overwrite)
    return RunResult(summary, Path(out))


def simulate(config: RunConfig | str | Path | None, out: str | Path, *, workers: int,
             shards: int | None = None, timing=None, overwrite: bool = False) -> RunResult:
    """Simulate ``config`` on ``workers`` workers and ``shards`` PS shards (default: the
    config's cluster.ps_shards) in this process, on a simulated clock (`recsync simulate`,
    docs/simulate.md): the real model, shards, modes and gradients, time modelled by
    ``timing`` (recsync.simulation.timing.Timing; None: the defaults, the compute cost measured
    here). Writes a run's outputs into ``out``, labelled SIMULATED. ValueError (nothing
    written) for what the simulator cannot model yet."""
    from recsync.simulation.run import simulate as run_simulation
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    keys = {"cluster.workers": workers}
    if shards is not None:
        keys["cluster.ps_shards"] = shards
    summary = run_simulation(override(cfg, **keys), out, timing=timing, overwrite=overwrite)
    return RunResult(summary, Path(out))


def convert(inputs, out: str | Path, *, schema: str | Path | None = None,
            preset: str | None = None, strict: bool = False, overwrite: bool = False,
            progress: bool = True, allow_empty_train: bool = False, dynamic: bool = False):
    """Convert CSV/TSV/Parquet files into a data set (`recsync data convert`): give a schema
    file or a shipped preset (criteo, avazu, movielens, taobao). Returns the conversion's
    report. A conversion with no training rows is refused unless ``allow_empty_train`` (an
    eval-only data set, to score). ``dynamic``: every table dynamic (`--dynamic`)."""
    from recsync.data.convert import convert as run_convert
    from recsync.data.schema import load_schema
    if (schema is None) == (preset is None):
        raise ValueError("give exactly one of schema (a TOML file) and preset (a name)")
    loaded = load_schema(schema, preset=preset) if schema is None else load_schema(schema)
    if dynamic:
        loaded = loaded.with_table_kind("dynamic")
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    return run_convert([str(p) for p in inputs], loaded, out, strict=strict,
                       overwrite=overwrite, progress=progress,
                       allow_empty_train=allow_empty_train)


def tune(config: RunConfig | str | Path | None, space: str | Path, trials: int,
         out: str | Path, **options):
    """A search over config keys on Ray Tune with ASHA (`recsync tune`, docs/tune.md): the
    base ``config``, the search ``space`` (a TOML file), ``trials`` runs; the table, plot and
    best.toml in ``out``. Options: overrides, concurrent, grace_period, reduction_factor,
    seed, overwrite, echo (where progress lines go; print) (recsync.tuning.search.tune). Returns a TuneResult (``best``,
    ``best_config``, ``trials``)."""
    from recsync.tuning import tune as run_tune
    return run_tune(config, space, trials, out, **options)


def scale(run_dir: str | Path, workers: int | None = None,
          drain_nodes: list[str] | None = None) -> dict:
    """Ask a running elastic run (``cluster.workers = [min, max]``, its ``--out`` directory
    ``run_dir``) for ``workers`` workers, or to move off ``drain_nodes``; returns the request
    (recsync/run/scale.py). The run takes it up within a second."""
    from recsync.run.scale import ask
    return ask(run_dir, workers, drain_nodes)


def load_model(path: str | Path, *, builder: str | None = None):
    """The trained model a run wrote (``OUT/model``) as a torch module
    (recsync.model_dir.trained.TrainedModel): ``score(rows)`` on raw rows, ``score_batch`` on
    a data set's batch, ``forward`` on preprocessed tensors. Nothing is unpickled and nothing
    the directory names is imported; ValueError (one line, naming the file) if the directory
    cannot be used. A user's model needs ``builder`` ("package.module:builder" or
    "path/to/file.py:builder"): that code is imported and run, so pass only code you trust."""
    from recsync.model_dir.trained import load_model as load
    return load(path, builder=builder)
