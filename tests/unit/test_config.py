"""RunConfig: defaults, TOML files, --set overrides, and error messages that name the key."""

from __future__ import annotations

import pytest

from recsync.config import ConfigError, RunConfig, load_config, parse_override


def write(tmp_path, text: str, name: str = "run.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ defaults

def test_defaults_validate_and_equal_an_empty_file(tmp_path):
    default = load_config()
    assert default == RunConfig()
    assert default.mode == "local"
    assert default.train.batch_size == 4096
    assert default.model.name == "dlrm"
    assert load_config(write(tmp_path, "")) == default


def test_toml_file_is_loaded(tmp_path):
    path = write(tmp_path, """
mode = "local"
[data]
path = "some/where"
shuffle = false
[model]
name = "lr"
bottom_mlp = [32, 16]
[train]
batch_size = 256
dense_lr = 0.5
embedding_optimizer = "sgd"
[output]
plot = false
""")
    cfg = load_config(path)
    assert cfg.data.path == "some/where"
    assert cfg.data.shuffle is False
    assert cfg.model.name == "lr"
    assert cfg.model.bottom_mlp == [32, 16]
    assert cfg.train.batch_size == 256
    assert cfg.train.dense_lr == 0.5
    assert cfg.train.embedding_optimizer == "sgd"
    assert cfg.output.plot is False
    # keys the file leaves out keep their defaults
    assert cfg.train.epochs == RunConfig().train.epochs
    assert cfg.model.top_mlp == RunConfig().model.top_mlp


# ------------------------------------------------------------------------------------ rejections

def test_unknown_key_in_a_section_is_named(tmp_path):
    path = write(tmp_path, "[train]\nbatch_size = 8\nbogus = 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert "train.bogus" in msg
    assert "unknown key" in msg
    assert str(path) in msg


def test_unknown_section_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"trian: unknown key"):
        load_config(write(tmp_path, "[trian]\nbatch_size = 8\n"))


def test_unknown_section_via_override():
    with pytest.raises(ConfigError, match=r"\n  bogus: unknown key"):
        load_config(None, ["bogus.x=1"])


@pytest.mark.parametrize("text, key", [
    ("[train]\nbatch_size = 0\n", "train.batch_size"),
    ('[train]\ndense_optimizer = "foo"\n', "train.dense_optimizer"),
    ('[train]\nembedding_optimizer = "adam"\n', "train.embedding_optimizer"),
    ("[model]\nembedding_dim = 0\n", "model.embedding_dim"),
    ("[train]\nseed = -1\n", "train.seed"),  # numpy's seeding takes no negative numbers
    ("[model]\nembedding_init_scale = 0.0\n", "model.embedding_init_scale"),
    ('mode = "hogwild"\n', "mode"),
    ('[data]\nshuffle = "maybe"\n', "data.shuffle"),
])
def test_bad_value_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    lines = str(e.value).splitlines()
    assert any(line.strip().startswith(f"{key}:") for line in lines), str(e.value)


def test_bad_value_shows_what_was_given(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer:.*'foo'"):
        load_config(write(tmp_path, '[train]\ndense_optimizer = "foo"\n'))


def test_bad_layer_sizes_are_rejected():
    with pytest.raises(ConfigError, match="bottom_mlp"):
        load_config(None, ["model.bottom_mlp=[16, 0]"])


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "[train\nbatch_size = = 3\n", name="broken.toml")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value)
    assert "not valid TOML" in str(e.value)


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value)
    assert "not found" in str(e.value)


def test_config_error_is_a_value_error():
    # the CLI turns ValueErrors into "error: ..." with exit status 2
    assert issubclass(ConfigError, ValueError)


# ------------------------------------------------------------------------------------ --set

def test_overrides_are_typed_as_toml():
    cfg = load_config(None, [
        "train.batch_size=1024",
        "train.dense_lr=0.125",
        "model.bottom_mlp=[64, 32]",
        'model.name="lr"',
        "data.shuffle=false",
        "data.path=runs/data/my-set",   # a bare word: taken as a string
        "output.log_every_steps = 7",
    ])
    assert cfg.train.batch_size == 1024 and isinstance(cfg.train.batch_size, int)
    assert cfg.train.dense_lr == 0.125
    assert cfg.model.bottom_mlp == [64, 32]
    assert cfg.model.name == "lr"
    assert cfg.data.shuffle is False
    assert cfg.data.path == "runs/data/my-set"
    assert cfg.output.log_every_steps == 7


def test_parse_override():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override('a.b="x y"') == (["a", "b"], "x y")
    assert parse_override("a.b=/tmp/x=y") == (["a", "b"], "/tmp/x=y")  # split at the first '='
    assert parse_override(" a . b =1") == (["a", "b"], 1)


def test_overrides_win_over_the_file(tmp_path):
    path = write(tmp_path, "[train]\nbatch_size = 8\nepochs = 3\n")
    cfg = load_config(path, ["train.batch_size=16"])
    assert cfg.train.batch_size == 16
    assert cfg.train.epochs == 3


def test_later_override_wins():
    assert load_config(None, ["train.epochs=2", "train.epochs=5"]).train.epochs == 5


def test_overrides_are_validated_like_the_file():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.batch_size=0"])
    assert "train.batch_size" in str(e.value)
    assert "--set train.batch_size=0" in str(e.value)  # the source says where the value came from


@pytest.mark.parametrize("item", ["train.batch_size", "=3", "  =3", ""])
def test_malformed_override(item):
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, [item])


def test_setting_below_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match="batch_size is a value, not a section"):
        load_config(None, ["train.batch_size=8", "train.batch_size.x=1"])


@pytest.mark.parametrize("item, key", [("train.batch_size.x=1", "train.batch_size"),
                                       ("mode.x=1", "mode")])
def test_setting_below_a_default_scalar_is_an_error(item, key):
    # the key is not in the tree yet, so the table {"x": 1} reaches validation, which names it
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert any(line.strip().startswith(f"{key}:") for line in str(e.value).splitlines())


def test_setting_below_a_scalar_from_the_file_is_an_error(tmp_path):
    path = write(tmp_path, "[train]\nbatch_size = 8\n")
    with pytest.raises(ConfigError, match="batch_size is a value"):
        load_config(path, ["train.batch_size.deep=1"])


# ------------------------------------------------------------------------------------ round trip

def test_to_toml_round_trips_defaults(tmp_path):
    cfg = RunConfig()
    assert load_config(write(tmp_path, cfg.to_toml())) == cfg


def test_to_toml_round_trips_a_changed_config(tmp_path):
    cfg = load_config(None, [
        "data.path=/data/x", "data.shuffle=false", "data.chunk_rows=123",
        'model.name="lr"', "model.embedding_dim=4", "model.bottom_mlp=[8]",
        "model.top_mlp=[]", "model.table_rows=1000", "model.embedding_init_scale=0.01",
        "train.batch_size=3", "train.seed=7", 'train.dense_optimizer="adam"',
        "train.dense_lr=1e-4", "output.progress=false",
    ])
    assert cfg != RunConfig()
    back = load_config(write(tmp_path, cfg.to_toml()))
    assert back == cfg
    assert back.model.top_mlp == []
    assert back.train.seed == 7


def test_partial_recovery_needs_checkpoints_and_a_mode_without_lock_step():
    with pytest.raises(ConfigError, match="set recovery.checkpoint_every_s"):
        load_config(None, ['mode="async"', 'recovery.kind="partial"'])
    with pytest.raises(ConfigError, match="mode 'sync' steps the PS shards in lock-step"):
        load_config(None, ['mode="sync"', 'recovery.kind="partial"',
                           "recovery.checkpoint_every_s=5"])
    cfg = load_config(None, ['mode="eager"', 'recovery.kind="partial"',
                             "recovery.checkpoint_every_s=5"])
    assert cfg.recovery.kind == "partial"
    with pytest.raises(ConfigError, match="mode \"local\" has none"):
        load_config(None, ["recovery.checkpoint_every_s=5"])


def test_recovery_kinds_and_cpr_rows_are_checked():
    cfg = load_config(None, ['mode="sync"', 'recovery.kind="full"',
                             "recovery.checkpoint_every_s=5"])  # full recovery works in sync
    assert cfg.recovery.kind == "full"
    with pytest.raises(ConfigError, match="chooses from the mean time between failures"):
        load_config(None, ['mode="async"', 'recovery.kind="auto"',
                           "recovery.checkpoint_every_s=5"])
    with pytest.raises(ConfigError, match="only partial recovery can restart from"):
        load_config(None, ['mode="async"', 'recovery.kind="full"', 'recovery.rows="mfu"',
                           "recovery.checkpoint_every_s=5"])
    with pytest.raises(ConfigError, match="not available with switching"):
        load_config(None, ['mode="sync"', 'recovery.kind="full"',
                           "recovery.checkpoint_every_s=5",
                           'switching.schedule=[{to="gba", at_s=5.0}]'])
    cfg = load_config(None, ['mode="async"', 'recovery.kind="partial"', 'recovery.rows="ssu"',
                             "recovery.mtbf_s=600"])
    assert cfg.recovery.rows == "ssu" and cfg.recovery.full_every == 4
