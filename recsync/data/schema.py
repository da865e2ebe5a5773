"""The schema of a raw CTR file: which column is the label, which are features and how each is
turned into numbers, and which rows are held out. A TOML file (or a shipped preset,
``recsync/data/presets/NAME.toml``) read by :func:`load_schema`; docs/data.md lists every key.

Strict like the run config: every key is known, a boolean is true or false, an integer is not
2.0; an error names the file and the key. Its bounds (table rows and dims, max_len, feature counts,
names) are the data set reader's own (recsync/data/meta_checks.py): a schema accepted here never
gives a data set that training refuses.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from recsync.data.meta_checks import (MAX_DIM, MAX_FEATURES, MAX_LIST_LEN, MAX_NAME_CHARS,
                                      MAX_TABLE_ROWS, NAME)
from recsync.safe_names import printable


class SchemaError(ValueError):
    """A schema file (or preset) cannot be read or holds bad values; one line naming the file
    and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True,
                              strict=True, allow_inf_nan=False)


class Input(_Section):
    delimiter: str = Field(",", min_length=1, max_length=1)
    """the field separator, one ASCII character other than a quote or a line end: "," for CSV,
    "\\t" for TSV"""
    header: bool = True
    """the first line of every (text) file names the columns"""
    columns: list[str] = []
    """the column names in file order, when there is no header (header = false)"""

    @model_validator(mode="after")
    def _columns(self):
        if not self.delimiter.isascii() or self.delimiter in "\"\r\n":
            raise ValueError(f"input.delimiter: '{printable(self.delimiter)}' cannot separate "
                             f"fields (one ASCII character other than a quote or a line end)")
        if not self.header and not self.columns:
            raise ValueError("input.columns: name the columns (in file order) when "
                             "input.header = false")
        if self.header and self.columns:
            raise ValueError("input.columns: only for files without a header (the header "
                             "names the columns); set input.header = false or drop columns")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError("input.columns: names repeat")
        return self


class Label(_Section):
    column: str
    """the column holding the label"""
    threshold: float | None = None
    """label = 1 if the value >= threshold (e.g. a rating >= 4); unset: the value must be 0 or
    1 (a row with anything else is bad)"""


class Dense(_Section):
    name: str
    column: str = ""
    """the source column (default: name)"""
    transform: Literal["log1p", "standardize", "none"] = "none"
    """"log1p": log(1 + max(x, 0)); "standardize": (x - mean) / std with mean and std of the
    train rows; "none": x. A missing value is 0 after the transform."""


class Categorical(_Section):
    name: str
    column: str = ""
    """the source column (default: name)"""
    table: str = ""
    """the embedding table (default: name); features naming the same table share its rows"""
    encoding: Literal["text", "hex32"] = "text"
    """how a value becomes an id: "text" hashes its bytes; "hex32" reads a value of exactly 8
    hex digits as a 32-bit integer and hashes that (Criteo's categories: the ids of `recsync
    data criteo`), any other value as "text" does"""


class MultiHot(_Section):
    name: str
    column: str = ""
    """the source column (default: name)"""
    table: str = ""
    """the embedding table (default: name); may be a single-hot feature's table"""
    separator: str = Field(min_length=1)
    """what separates the elements of a list, e.g. "|"; empty elements are dropped"""
    max_len: int = Field(ge=1, le=MAX_LIST_LEN)
    """longer lists keep their first max_len elements (counted; --strict: an error)"""
    pooling: Literal["sum", "mean"] = "mean"
    """how the model combines the elements' embedding rows"""


TableKind = Literal["fixed", "dynamic"]


class TableSpec(_Section):
    rows: int | None = Field(None, ge=2, le=MAX_TABLE_ROWS)
    """rows of the table (unset: defaults.table_rows). A fixed table: values hash to ids
    1..rows-1, row 0 is 'missing'. A dynamic table: the rows it is sized for (the size memory
    checks and the model see), not a bound on its ids"""
    dim: int | None = Field(None, ge=1, le=MAX_DIM)
    """embedding width of this table (unset: the model's embedding_dim)"""
    kind: TableKind | None = None
    """"fixed": id = 1 + hash % (rows - 1), so distinct values may share a row; "dynamic": id =
    the value's full 64-bit hash as an int64 (negative ones too; 0 is missing, a hash of 0 is
    id 1), rows keyed by id; unset: defaults.table_kind"""


class Defaults(_Section):
    table_rows: int = Field(1_000_000, ge=2, le=MAX_TABLE_ROWS)
    """rows of every table whose [tables.NAME] entry sets none"""
    table_kind: TableKind = "fixed"
    """kind ("fixed" or "dynamic") of every table whose [tables.NAME] entry sets none"""


class Split(_Section):
    eval_fraction: float | None = Field(None, ge=0, lt=1)
    """the last fraction of the rows (input order: inputs must be in time order) is eval"""
    column: str = ""
    """rows whose value in this column is one of `values` are eval"""
    values: list[str | int] = []
    """the values of `column` (compared as text) that mark eval rows"""
    eval_files: list[str] = []
    """glob patterns (fnmatch): inputs whose name or path matches are eval, the others train"""

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k, on in (("eval_fraction", self.eval_fraction is not None),
                                 ("column", bool(self.column)),
                                 ("eval_files", bool(self.eval_files))) if on]
        if len(kinds) > 1:
            raise ValueError(f"split: choose one of eval_fraction, column or eval_files "
                             f"(got {' and '.join(kinds)})")
        if bool(self.column) != bool(self.values):
            raise ValueError("split: column and values go together (rows whose column holds "
                             "one of the values are eval)")
        return self

    @property
    def fraction(self) -> float:
        """The eval fraction in effect: 0.1 when the split says nothing."""
        if self.eval_fraction is not None:
            return self.eval_fraction
        return 0.0 if (self.column or self.eval_files) else 0.1


class Schema(_Section):
    input: Input = Input()
    label: Label
    weight: str = ""
    """a column of per-row loss weights (finite, >= 0); empty: no weights"""
    dense: list[Dense] = []
    categorical: list[Categorical] = []
    multi_hot: list[MultiHot] = []
    tables: dict[str, TableSpec] = {}
    """[tables.NAME]: rows, dim and kind of one table"""
    defaults: Defaults = Defaults()
    split: Split = Split()

    @model_validator(mode="after")
    def _names(self):
        names = [f.name for f in (*self.dense, *self.categorical, *self.multi_hot)]
        seen = set()
        for n in names:
            if n in seen:
                raise ValueError(f"feature name {n!r} is used twice")
            seen.add(n)
        if not self.categorical and not self.multi_hot:
            raise ValueError("no sparse features: add [[categorical]] or [[multi_hot]] (a data "
                             "set has at least one embedding table)")
        for kind in ("dense", "categorical", "multi_hot"):
            features = getattr(self, kind)
            if len(features) > MAX_FEATURES:
                raise ValueError(f"{kind}: {len(features):,} features, more than {MAX_FEATURES:,}")
            for i, f in enumerate(features):
                for key in ("name", "table") if kind != "dense" else ("name",):
                    value = getattr(f, key)
                    if (value or key == "name") and not NAME.fullmatch(value):
                        raise ValueError(f"{kind}.{i}.{key}: '{printable(value)}' must be 1 to "
                                         f"{MAX_NAME_CHARS} characters, none a control "
                                         f"character")
        if len(self.categorical) + len(self.multi_hot) > MAX_FEATURES:
            raise ValueError(f"categorical and multi_hot: more than {MAX_FEATURES:,} sparse "
                             f"features")
        unused = set(self.tables) - set(self.table_names())
        if unused:
            raise ValueError(f"tables.{sorted(unused)[0]}: no feature uses this table")
        return self

    def table_names(self) -> list[str]:
        """Every table, in order of first use (categorical features, then multi-hot)."""
        out: list[str] = []
        for f in (*self.categorical, *self.multi_hot):
            t = f.table or f.name
            if t not in out:
                out.append(t)
        return out

    def table_rows(self, table: str) -> int:
        spec = self.tables.get(table)
        return spec.rows if spec and spec.rows else self.defaults.table_rows

    def table_kind(self, table: str) -> str:
        """"fixed" or "dynamic" (TableSpec.kind)."""
        spec = self.tables.get(table)
        return spec.kind if spec and spec.kind else self.defaults.table_kind

    def with_table_kind(self, kind: str) -> Schema:
        """This schema with every table of ``kind`` ("fixed" or "dynamic"): what ``--dynamic``
        asks for. Rows and dims stay as they were."""
        if kind not in ("fixed", "dynamic"):
            raise SchemaError(f"table kind {kind!r}: must be fixed or dynamic")
        return self.model_copy(update={
            "defaults": self.defaults.model_copy(update={"table_kind": kind}),
            "tables": {n: t.model_copy(update={"kind": kind}) for n, t in self.tables.items()}})

    def column_keys(self) -> dict[str, str]:
        """The source columns a conversion reads, each once, in schema order, with the first
        schema key that names it (for messages)."""
        keys = {self.label.column: "label.column"}
        if self.weight:
            keys.setdefault(self.weight, "weight")
        for kind in ("dense", "categorical", "multi_hot"):
            for i, f in enumerate(getattr(self, kind)):
                keys.setdefault(f.column or f.name,
                                f"{kind}[{i}].column" if f.column else f"{kind}[{i}].name")
        if self.split.column:
            keys.setdefault(self.split.column, "split.column")
        return keys


PRESET_DIR = "presets"


def preset_names() -> list[str]:
    """The shipped presets (recsync/data/presets/*.toml)."""
    folder = resources.files("recsync.data") / PRESET_DIR
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_preset(name: str) -> Schema:
    names = preset_names()
    if name not in names:
        raise SchemaError(f"unknown preset {name!r}; presets: {', '.join(names)}")
    text = (resources.files("recsync.data") / PRESET_DIR / f"{name}.toml").read_text()
    return parse_schema(text, f"preset {name}")


def load_schema(path: str | Path | None = None, *, preset: str | None = None) -> Schema:
    """Read and check a TOML schema file, or the shipped ``preset``; SchemaError (one line,
    naming the file) if bad."""
    if preset is not None:
        return load_preset(preset)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SchemaError(f"{path}: schema file not found") from None
    except UnicodeDecodeError:
        raise SchemaError(f"{path}: not a text file (a schema is UTF-8 TOML)") from None
    except OSError as e:
        raise SchemaError(f"{path}: cannot read the schema ({e.strerror})") from None
    return parse_schema(text, str(path))


def parse_schema(text: str, source: str) -> Schema:
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SchemaError(f"{source}: not valid TOML: {e}") from None
    try:
        return Schema.model_validate(tree)
    except ValidationError as e:
        raise SchemaError(f"{source}: {describe_errors(e)}") from None


def describe_errors(err: ValidationError) -> str:
    """A ValidationError of a schema in one line: each bad key and what is wrong with it."""
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key")
        elif e["type"] == "missing":
            parts.append(f"{key}: missing")
        elif e["type"] == "value_error":
            msg = str(e["ctx"]["error"])
            parts.append(f"{key}: {msg}" if key else msg)
        else:
            got = "" if isinstance(e["input"], (dict, list)) else f" (got {e['input']!r:.60})"
            parts.append(f"{key}: {e['msg']}{got}")
    return "; ".join(parts)
