"""Criteo click logs on the one conversion path: ``recsync data criteo`` is ``recsync data
convert`` with preset ``criteo`` (raw Kaggle / Terabyte TSV) or ``criteo_csv`` (DeepCTR's CSV
sample, whose first line is ``label,I1,...``), chosen from the first input's first bytes, with
its table sizes and eval fraction set from the flags.

Both presets read the 26 categories with ``encoding = "hex32"``: the ids ``recsync data criteo``
has always written. A data set written by the converter this module used to hold (meta.json
``source.kind`` "criteo", no ``preprocessing``) is given the schema it was made with
(:func:`criteo_preprocessing`), so its models score raw Criteo rows like any converted data set.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from recsync.data.convert import HASH_NAME, ConvertReport, convert
from recsync.data.convert_input import ConvertError, head_bytes, open_source
from recsync.data.format import Layout, criteo_layout
from recsync.data.output import check_target
from recsync.data.schema import Schema, SchemaError, describe_errors, load_preset

CSV_START = b"label,"  # DeepCTR's CSV header starts so; a raw TSV line starts with its label


def convert_criteo(paths, out_dir, *, table_size: int = 1_000_000,
                   table_size_overrides: dict[str, int] | None = None,
                   eval_fraction: float = 0.1, dynamic: bool = False, strict: bool = False,
                   overwrite: bool = False, progress: bool = True,
                   block_bytes: int | None = None) -> ConvertReport:
    """`recsync data criteo`: convert Criteo files (read in order, as one time-ordered stream)
    into ``out_dir`` as :func:`recsync.data.convert.convert` does, with the Criteo preset the
    files' layout asks for; ``dynamic``: every table dynamic (ids the values' full 64-bit
    hashes, table sizes only what the tables are sized for). ``out_dir`` is checked before any
    input is read."""
    check_target(Path(out_dir), overwrite)
    schema = criteo_schema(criteo_preset(paths), table_size=table_size,
                           table_size_overrides=table_size_overrides, eval_fraction=eval_fraction,
                           dynamic=dynamic)
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return convert(paths, schema, out_dir, strict=strict, overwrite=overwrite, progress=progress,
                   **({"block_bytes": block_bytes} if block_bytes else {}))


def criteo_preset(paths) -> str:
    """"criteo" or "criteo_csv": the layout of the inputs (all alike), from their first bytes;
    ConvertError naming a file that differs from the first."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ValueError("no input files given")
    kinds, tsv = [], load_preset("criteo")
    for p in paths:
        src = open_source(str(p), tsv)
        if src.kind != "text":
            raise ConvertError(f"{p}: a Parquet file, not Criteo text; convert it with "
                               f"`recsync data convert --schema`")
        kinds.append("criteo_csv" if head_bytes(src, len(CSV_START)) == CSV_START else "criteo")
        if kinds[-1] != kinds[0]:
            what = {"criteo": "raw Criteo TSV", "criteo_csv": "DeepCTR's Criteo CSV"}
            raise ConvertError(f"{p}: {what[kinds[-1]]}, but {paths[0]} is {what[kinds[0]]}; "
                               f"convert them separately")
    return kinds[0]


def criteo_schema(preset: str = "criteo", *, table_size: int = 1_000_000,
                  table_size_overrides: dict[str, int] | None = None,
                  eval_fraction: float = 0.1, dynamic: bool = False) -> Schema:
    """Preset ``preset`` with every table's rows (``table_size``, or an override by table name
    C1..C26), the eval fraction and, with ``dynamic``, every table dynamic; SchemaError naming
    the bad value."""
    base = load_preset(preset)
    tables = [f.name for f in base.categorical]
    for name in table_size_overrides or {}:
        if name not in tables:
            raise SchemaError(f"--table-size {name}=...: unknown table (tables are C1..C26)")
    tree = base.model_dump(mode="json")
    tree["defaults"]["table_rows"] = table_size
    tree["defaults"]["table_kind"] = "dynamic" if dynamic else "fixed"
    tree["tables"] = {n: {"rows": r} for n, r in (table_size_overrides or {}).items()}
    tree["split"] = {"eval_fraction": eval_fraction}
    try:
        return Schema.model_validate(tree)
    except ValidationError as e:  # a table size or fraction out of its bounds
        raise SchemaError(f"criteo: {describe_errors(e)}") from None


def criteo_preprocessing(meta: dict) -> dict:
    """meta.json's ``preprocessing`` for a data set the former ``recsync data criteo`` converter
    wrote (it stored none): preset criteo with the data set's table sizes. ValueError if the
    data set does not have the Criteo layout."""
    layout = Layout.from_meta(meta)
    rows = [t.rows for t in layout.tables]
    if layout != criteo_layout(rows):
        raise ValueError("meta.json: a 'criteo' data set without the Criteo layout (I1..I13, "
                         "C1..C26); its raw rows cannot be scored")
    schema = criteo_schema(table_size=rows[0], eval_fraction=0.0,
                           table_size_overrides={t.name: t.rows for t in layout.tables})
    return {"schema": schema.model_dump(mode="json"), "hash": HASH_NAME, "log1p": "float64",
            "standardize": {}}
