"""The search space file of `recsync tune` (recsync/tuning/space.py): what it accepts, and a
one-line error naming the file and the key for everything it refuses. No Ray.

    pytest tests/unit/test_tune_space.py
"""

from __future__ import annotations

import pytest

from recsync.config import ConfigError, load_config
from recsync.tuning.space import load_space, parse_space


@pytest.fixture(scope="module")
def base():
    return load_config(None, ["train.validation=0.1"])


def parse(text: str, base, tmp_path):
    path = tmp_path / "space.toml"
    path.write_text(text)
    return load_space(path, base)


def refused(text: str, base, tmp_path) -> str:
    with pytest.raises(ConfigError) as e:
        parse(text, base, tmp_path)
    message = str(e.value)
    assert "\n" not in message, message  # one line
    assert str(tmp_path / "space.toml") in message
    return message


def test_every_distribution_is_read_in_file_order_from_dotted_keys_and_tables(base, tmp_path):
    space = parse('''
"train.dense_lr" = {loguniform = [1e-4, 0.1]}
"train.batch_size" = {logint = [64, 1024]}
mode = {choice = ["local"]}
[model]
dropout = {uniform = [0.0, 0.3]}
cross_layers = {int = [1, 4]}
embedding_dim = {grid = [8, 16, 32]}
name = {choice = ["dlrm", "dcn"]}
''', base, tmp_path)
    assert space.keys == ["train.dense_lr", "train.batch_size", "mode", "model.dropout",
                          "model.cross_layers", "model.embedding_dim", "model.name"]
    kinds = {p.key: (p.kind, p.values) for p in space.params}
    assert kinds["train.dense_lr"] == ("loguniform", (1e-4, 0.1))
    assert kinds["train.batch_size"] == ("logint", (64, 1024))
    assert kinds["model.dropout"] == ("uniform", (0.0, 0.3))
    assert kinds["model.embedding_dim"] == ("grid", (8, 16, 32))
    assert space.grid_points == 3
    assert space.values_of("model.name") == ("dlrm", "dcn")


def test_a_free_form_tables_keys_may_be_searched(base, tmp_path):
    space = parse('"model.params.width" = {choice = [4, 8]}', base, tmp_path)
    assert space.keys == ["model.params.width"]


@pytest.mark.parametrize("text, expected", [
    ('"train.lr" = {loguniform = [1e-4, 0.1]}',
     "train.lr: unknown config key (train has "),
    ('"trian.dense_lr" = {loguniform = [1e-4, 0.1]}', "trian.dense_lr: unknown config key"),
    ('"train" = {choice = [1, 2]}', "train: is a section, not a value"),
    ('"train.dense_lr.x" = {choice = [1, 2]}', "train.dense_lr is a value, not a section"),
    ('"train.dense_lr" = {logunifrom = [1e-4, 0.1]}',
     "train.dense_lr: unknown distribution 'logunifrom'; one of loguniform, uniform"),
    ('"train.dense_lr" = 0.01', "train.dense_lr: expected a distribution table"),
    ('"train.dense_lr" = {}', "train.dense_lr: give exactly one distribution (got nothing)"),
    ('"train.dense_lr" = {uniform = [0.1, 0.2], loguniform = [0.1, 0.2]}',
     "train.dense_lr: give exactly one distribution (got uniform, loguniform)"),
    ('"train.dense_lr" = {loguniform = 0.1}', "train.dense_lr: loguniform takes [low, high]"),
    ('"train.dense_lr" = {loguniform = [0.1]}', "loguniform takes [low, high], 0 < low < high"),
    ('"train.dense_lr" = {loguniform = [0.1, 0.01]}',
     "train.dense_lr: loguniform needs low < high (got [0.1, 0.01])"),
    ('"train.dense_lr" = {loguniform = [0.0, 0.1]}',
     "train.dense_lr: loguniform needs low > 0 (got 0.0)"),
    ('"train.dense_lr" = {uniform = [0.1, 0.1]}', "uniform needs low < high"),
    ('"train.dense_lr" = {uniform = ["a", 0.1]}',
     "train.dense_lr: uniform bounds must be numbers (got 'a')"),
    ('"train.dense_lr" = {uniform = [0.0, inf]}', "uniform bounds must be finite"),
    ('"train.batch_size" = {int = [64.0, 128]}',
     "train.batch_size: int bounds must be integers (got 64.0)"),
    ('"train.batch_size" = {int = [256, 128]}', "int needs low <= high (got [256, 128])"),
    ('"train.batch_size" = {logint = [0, 128]}', "logint needs low > 0"),
    ('"train.batch_size" = {choice = []}', "train.batch_size: choice needs at least one value"),
    ('"train.batch_size" = {grid = [64, 64]}', "train.batch_size: grid lists 64 twice"),
    # bounds and values the config itself refuses, by the config's own words
    ('"train.batch_size" = {int = [0, 128]}',
     "train.batch_size = 0 is refused by the config: train.batch_size: Input should be "
     "greater than or equal to 1"),
    ('"train.dense_lr" = {uniform = [-0.1, 0.1]}', "train.dense_lr = -0.1 is refused"),
    ('"model.dropout" = {uniform = [0.0, 1.5]}', "model.dropout = 1.5 is refused"),
    ('"train.batch_size" = {choice = [64, "big"]}', "train.batch_size = 'big' is refused"),
    ('"mode" = {choice = ["local", "turbo"]}', "mode = 'turbo' is refused by the config"),
    ('"model.bottom_mlp" = {choice = [8]}', "model.bottom_mlp = 8 is refused"),
])
def test_a_bad_space_is_refused_in_one_line_naming_the_key(text, expected, base, tmp_path):
    assert expected in refused(text, base, tmp_path)


def test_a_key_given_twice_is_refused(base, tmp_path):
    message = refused('"train.seed" = {choice = [1, 2]}\n[train]\nseed = {choice = [3]}\n',
                      base, tmp_path)
    assert "train.seed: given twice" in message


def test_an_empty_missing_or_broken_file_is_refused(base, tmp_path):
    assert "no key to search" in refused("", base, tmp_path)
    assert "not valid TOML" in refused('"train.seed" = {choice = [1, 2]', base, tmp_path)
    with pytest.raises(ConfigError, match="nope.toml: search space file not found"):
        load_space(tmp_path / "nope.toml", base)


def test_values_are_checked_against_the_base_config_with_its_other_keys():
    # cluster.workers = 3 is fine alone, but a straggler on worker 2 needs workers > 2
    base = load_config(None, ['mode="async"', "cluster.workers=3",
                              "faults.stragglers=[{worker = 2, factor = 2.0}]"])
    with pytest.raises(ConfigError, match="cluster.workers = 2 is refused by the config: "
                                          "faults.stragglers"):
        parse_space({"cluster": {"workers": {"choice": [3, 2]}}}, base, "space")
