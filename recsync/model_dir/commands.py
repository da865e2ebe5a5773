"""The bodies of `recsync predict` and `recsync export` (their options are in recsync/cli.py):
call the library, print what was written."""

from __future__ import annotations

import click


def predict_command(model_dir, inputs, out, *, split, batch_size, strict, overwrite,
                    builder) -> None:
    from recsync.model_dir.predict import predict
    r = predict(model_dir, list(inputs), out, split=split, batch_size=batch_size,
                strict=strict, overwrite=overwrite, builder=builder)
    if r["bad"]:
        click.echo(f"{r['bad']:,} bad rows scored null; first:", err=True)
        for e in r["examples"]:
            click.echo(f"  {e.where}: " + (f"column {e.column}: " if e.column else "")
                       + e.reason, err=True)
    click.echo(f"wrote {r['rows']:,} scores to {out} in {r['seconds']:.1f} s")


def export_command(model_dir, out, *, fmt, max_bytes, overwrite, builder) -> None:
    from recsync.model_dir.export import export_model
    r = export_model(model_dir, out, fmt=fmt, max_bytes=max_bytes, overwrite=overwrite,
                     builder=builder)
    click.echo(f"wrote {out} ({r['bytes'] / 2**20:,.1f} MiB, tables "
               f"{r['tables_bytes'] / 2**20:,.1f} MiB) in {r['seconds']:.1f} s")
