"""model.dynamic: the settings every dynamic table gets and one table's own, the tables they
apply to, and the rows a run with dynamic tables holds."""

import pytest

from recsync.config import load_config
from recsync.embedding.spec import TableSpec
from recsync.model.inputs import DataTable, ModelInputs
from recsync.model.setup import with_dynamic
from recsync.run.preflight import held_rows


def inputs():
    return ModelInputs(dense=(), features=(), tables=(DataTable("a", 100, None, dynamic=True),
                                                      DataTable("f", 100, None)))


def test_a_table_takes_the_sections_settings_with_its_own_on_top():
    cfg = load_config(None, ["model.dynamic.capacity=500", 'model.dynamic.eviction="lru"',
                             "model.dynamic.tables.a.admit_after=3"])
    tables = with_dynamic([TableSpec("a", 100, 4), TableSpec("a_wide", 100, 1, source="a"),
                           TableSpec("f", 100, 4)], inputs(), cfg.model)
    assert tables[0].dynamic.capacity == 500 and tables[0].dynamic.admit_after == 3
    assert tables[0].dynamic.eviction == "lru" and tables[1].dynamic == tables[0].dynamic
    assert tables[2].dynamic is None  # a fixed data table stays fixed


def test_settings_for_a_table_that_is_not_dynamic_are_refused_naming_it():
    cfg = load_config(None, ["model.dynamic.tables.f.capacity=10"])
    with pytest.raises(ValueError, match=r"model.dynamic.tables.f: .*dynamic tables: a"):
        with_dynamic([TableSpec("a", 100, 4), TableSpec("f", 100, 4)], inputs(), cfg.model)


@pytest.mark.parametrize("override,key", [("model.dynamic.capacity=0", "capacity"),
                                          ("model.dynamic.capacity=4294967296", "capacity"),
                                          ("model.dynamic.admit_after=70000", "admit_after"),
                                          ('model.dynamic.tables.a.eviction="fifo"', "eviction")])
def test_bad_settings_name_their_key(override, key):
    with pytest.raises(ValueError, match=key):
        load_config(None, [override])


def test_memory_counts_every_shards_capacity():
    cfg = load_config(None, ['mode="async"', "cluster.ps_shards=3", 'recovery.kind="partial"',
                             'recovery.rows="mfu"', "recovery.checkpoint_every_s=10",
                             "model.dynamic.capacity=50"])
    tables = with_dynamic([TableSpec("a", 100, 4), TableSpec("f", 100, 4)], inputs(), cfg.model)
    assert held_rows(cfg, tables) == [150, 100]
