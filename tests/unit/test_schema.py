"""The TOML schema of `recsync data convert` (recsync/data/schema.py) and its shipped presets.

    PYTHONPATH=. python -m pytest -q tests/unit/test_schema.py
"""

from __future__ import annotations

import pytest

from recsync.data.convert import layout_of
from recsync.data.schema import SchemaError, load_preset, load_schema, parse_schema, preset_names

BASE = '[label]\ncolumn = "y"\n\n[[categorical]]\nname = "c"\n'


def test_presets_load():
    assert preset_names() == ["avazu", "criteo", "criteo_csv", "movielens", "taobao"]
    for name in preset_names():
        assert load_preset(name).column_keys()
    criteo = load_preset("criteo")
    assert criteo.input.delimiter == "\t" and len(criteo.input.columns) == 40
    assert [d.transform for d in criteo.dense] == ["log1p"] * 13
    taobao = layout_of(load_preset("taobao"))
    assert [f.table for f in taobao.features if f.name in ("adgroup_id", "click_sequence")] \
        == ["item", "item"]
    assert taobao.multi[0].pooling == "mean"
    ml = load_preset("movielens")
    assert ml.label.threshold == 4 and ml.split.fraction == 0.2
    assert "id" not in load_preset("avazu").column_keys()


def test_defaults_and_tables():
    s = parse_schema(BASE + '[[categorical]]\nname = "d"\ntable = "c"\n[tables.c]\nrows = 10\n'
                     'dim = 8\n', "t")
    layout = layout_of(s)
    assert [t.name for t in layout.tables] == ["c"] and layout.tables[0].dim == 8
    assert s.table_rows("c") == 10 and s.split.fraction == 0.1
    assert s.input.header and s.input.delimiter == ","


@pytest.mark.parametrize("extra, message", [
    ('[[dense]]\nname = "x"\ntransform = "sqrt"\n', "dense.0.transform"),
    ('colour = "red"\n', "colour: unknown key"),
    ('[input]\nheader = false\n', "input.columns: name the columns"),
    ('[input]\ncolumns = ["a"]\n', "only for files without a header"),
    ('[tables.zzz]\nrows = 10\n', "tables.zzz: no feature uses this table"),
    ('[tables.c]\nrows = 1\n', "tables.c.rows"),
    ('[split]\neval_fraction = 0.2\neval_files = ["*v*"]\n', "choose one of"),
    ('[split]\ncolumn = "day"\n', "column and values go together"),
    ('[[categorical]]\nname = "c"\n', "feature name 'c' is used twice"),
    ('[[multi_hot]]\nname = "m"\nseparator = "|"\n', "multi_hot.0.max_len: missing"),
    ('[input]\ndelimiter = ";;"\n', "input.delimiter"),
    ('[defaults]\ntable_rows = 2.5\n', "defaults.table_rows"),
])
def test_bad_schema_names_the_key(extra, message):
    with pytest.raises(SchemaError, match="^my.toml: .*" + message.replace("*", r"\*")) as e:
        parse_schema(BASE + extra, "my.toml")
    assert "\n" not in str(e.value)


def test_schema_file_errors(tmp_path):
    with pytest.raises(SchemaError, match="schema file not found"):
        load_schema(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[label\n")
    with pytest.raises(SchemaError, match="bad.toml: not valid TOML"):
        load_schema(bad)
    with pytest.raises(SchemaError, match="unknown preset 'criteo2'; presets: avazu, criteo"):
        load_preset("criteo2")
    with pytest.raises(SchemaError, match="label: missing"):
        parse_schema('[[categorical]]\nname = "c"\n', "t")
