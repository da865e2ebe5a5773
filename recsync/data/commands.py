"""`recsync data`: make or convert data sets (its commands' flags, and the one-line report of a
conversion); the work is the library's (recsync/data/)."""

from __future__ import annotations

import click

from recsync.cli_errors import writing


@click.group()
def data():
    """Make or convert data sets."""


@data.command()
@click.option("--rows", type=int, required=True, help="Training rows.")
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--eval-rows", type=int, default=None, help="Held-out rows [default: rows/10].")
@click.option("--max-table-rows", type=int, default=100_000, show_default=True,
              help="Cap on every table's cardinality.")
@click.option("--processes", type=int, default=2, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace a data set already in --out.")
def synth(rows, out, seed, eval_rows, max_table_rows, processes, overwrite):
    """Generate synthetic Criteo-shaped data with a planted teacher (known Bayes AUC)."""
    from recsync.data.synthetic import SynthSpec, generate
    with writing(out):
        r = generate(out, rows=rows, eval_rows=eval_rows, processes=processes,
                     spec=SynthSpec(seed=seed, max_table_rows=max_table_rows),
                     overwrite=overwrite)
    click.echo(f"wrote {r.train_rows:,} train + {r.eval_rows:,} eval rows to {out} in "
               f"{r.seconds:.1f} s ({r.rows_per_s:,.0f} rows/s); eval CTR {r.ctr:.3f}, "
               f"Bayes-optimal AUC {r.bayes_auc:.4f}, logloss {r.bayes_logloss:.4f}")


DYNAMIC_HELP = ("Make every table dynamic: a value's id is its full 64-bit hash (int64), so "
                "distinct values never share a row; table sizes then only say how many rows "
                "each table is sized for (docs/data.md, Dynamic tables).")


def _table_sizes(values: tuple[str, ...]) -> tuple[int, dict[str, int]]:
    default, overrides = 1_000_000, {}
    for v in values:
        name, sep, num = v.partition("=")
        try:
            if sep:
                overrides[name.strip()] = int(num)
            else:
                default = int(v)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected N or NAME=N (e.g. C3=50000)",
                                     param_hint="--table-size") from None
    return default, overrides


@data.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--strict", is_flag=True, help="Stop at the first bad line instead of skipping it.")
@click.option("--table-size", "table_size", multiple=True, metavar="N | NAME=N",
              help="Rows of every hashed table (default 1,000,000), or of one table "
                   "(e.g. C3=50000). Repeatable.")
@click.option("--eval-fraction", type=float, default=0.1, show_default=True,
              help="The last fraction of the input lines becomes the eval split.")
@click.option("--dynamic", is_flag=True, help=DYNAMIC_HELP)
@click.option("--overwrite", is_flag=True,
              help="Replace a data set already in --out (once the new one is complete).")
def criteo(files, out, strict, table_size, eval_fraction, dynamic, overwrite):
    """Convert Criteo files (raw TSV or DeepCTR's CSV sample; plain, gzip, bz2, zstd or xz)
    into training shards: `data convert` with preset criteo or criteo_csv."""
    from recsync.data.criteo import convert_criteo
    default, overrides = _table_sizes(table_size)
    with writing(out):
        r = convert_criteo(list(files), out, table_size=default, table_size_overrides=overrides,
                           eval_fraction=eval_fraction, dynamic=dynamic, strict=strict,
                           overwrite=overwrite)
    _report_conversion(r, files, out)


@data.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--schema", "schema_path", type=click.Path(dir_okay=False),
              help="TOML schema of the inputs (docs/data.md lists every key).")
@click.option("--preset", help="A shipped schema instead of --schema: criteo, criteo_csv, avazu, "
                               "movielens, taobao.")
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--strict", is_flag=True,
              help="Stop at the first bad row or over-long list instead of skipping it.")
@click.option("--overwrite", is_flag=True,
              help="Replace a data set already in --out (once the new one is complete).")
@click.option("--allow-empty-train", is_flag=True, help="Accept no train rows (eval only).")
@click.option("--dynamic", is_flag=True, help=DYNAMIC_HELP + " Overrides the schema's kinds.")
def convert(inputs, schema_path, preset, out, strict, overwrite, allow_empty_train, dynamic):
    """Convert CSV/TSV (plain, gzip, bzip2, zstd) or Parquet files, as a schema describes them,
    into training shards."""
    from recsync.data.convert import convert as run_convert
    from recsync.data.schema import load_preset, load_schema
    if bool(schema_path) == bool(preset):
        raise click.UsageError("give one of --schema FILE or --preset NAME")
    with writing(out):
        schema = load_schema(schema_path) if schema_path else load_preset(preset)
        if dynamic:
            schema = schema.with_table_kind("dynamic")
        r = run_convert(list(inputs), schema, out, strict=strict, overwrite=overwrite,
                        allow_empty_train=allow_empty_train)
    _report_conversion(r, inputs, out)


def _report_conversion(r, inputs, out) -> None:
    click.echo(f"converted {r.lines:,} lines of {len(inputs)} file(s) in {r.seconds:.1f} s "
               f"({r.lines / max(r.seconds, 1e-9):,.0f} lines/s): {r.train_rows:,} train + "
               f"{r.eval_rows:,} eval rows written to {out}, {r.bad_lines:,} bad lines skipped"
               + (f", {r.truncated:,} lists cut to max_len" if r.truncated else ""))
    for bad in r.examples:
        click.echo(f"  skipped {bad.where}: " + (f"column {bad.column}: " if bad.column else "")
                   + bad.reason)
