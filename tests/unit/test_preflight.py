"""A run that cannot succeed is refused before any actor starts, with nothing written: bad
config values, an output or checkpoint directory that cannot be written, too little disk; a
failed run leaves its --out reusable; a diverging model stops a local run with its summary."""

from __future__ import annotations

import json
from collections import namedtuple

import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.config import ConfigError, load_config
from recsync.data.synthetic import SynthSpec, generate
from recsync.distributed.errors import RunFailed
from recsync.run import preflight
from recsync.run.driver import run

SMALL = ["model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
         "train.batch_size=50", "output.progress=false", "output.plot=false"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=600, eval_rows=100, spec=SynthSpec(seed=4, max_table_rows=100),
             processes=1, progress=False)
    return root


def train(out, data, *sets):
    args = ["train", "--out", str(out), "--set", f"data.path={json.dumps(str(data))}"]
    for s in [*SMALL, *sets]:
        args += ["--set", s]
    return CliRunner().invoke(main, args)


def refused(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output


@pytest.mark.parametrize("item, needle", [
    ("train.dense_lr=inf", "train.dense_lr: Input should be a finite number"),
    ("train.embedding_lr=nan", "train.embedding_lr: Input should be a finite number"),
    ("train.batch_size=true", "train.batch_size: Input should be a valid integer"),
    ("train.epochs=2.0", "train.epochs: Input should be a valid integer"),
    ("data.shuffle=1", "data.shuffle: Input should be a valid boolean"),
])
def test_bad_values_are_refused_with_their_key(item, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, [item])


def test_a_binary_config_file_is_named(tmp_path):
    path = tmp_path / "model.toml"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match=f"{path}: not a text file"):
        load_config(path)


def test_an_out_that_cannot_be_made_is_refused_before_anything_is_written(data, tmp_path):
    (tmp_path / "file").write_text("a file where a directory would go")
    refused(train(tmp_path / "file" / "run", data), "cannot be made", str(tmp_path / "file"))


@pytest.fixture
def read_only_dir(mount_tmpfs):
    return mount_tmpfs("ro,size=1m")


def test_an_out_on_a_read_only_file_system_is_refused(data, read_only_dir):
    refused(train(read_only_dir / "run", data), "not writable", "Read-only file system")


def test_a_read_only_checkpoint_dir_is_refused_before_ray_starts(data, tmp_path, read_only_dir):
    result = train(tmp_path / "run", data, 'mode="async"', 'recovery.kind="partial"',
                   "recovery.checkpoint_every_s=1.0",
                   f"recovery.dir={json.dumps(str(read_only_dir / 'ckpt'))}")
    refused(result, str(read_only_dir / "ckpt"), "not writable")
    assert not (tmp_path / "run").exists()


def test_too_little_disk_for_the_checkpoints_is_refused_with_both_figures(data, tmp_path,
                                                                          monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage(10**6, 10**6, 4096))
    result = train(tmp_path / "run", data, 'mode="async"', 'recovery.kind="partial"',
                   "recovery.checkpoint_every_s=1.0")
    refused(result, "4.0 KB free", "this run writes about", "checkpoints of")
    assert not (tmp_path / "run").exists()


def test_the_free_space_is_shown_against_the_estimate(data, tmp_path, capsys):
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, 'mode="async"',
                             'recovery.kind="partial"', "recovery.checkpoint_every_s=1.0"])
    preflight.preflight(cfg, tmp_path / "run")
    line = capsys.readouterr().err
    assert f"preflight: {tmp_path / 'run'}: " in line and " free, the run writes about " in line
    model = preflight.model_bytes(cfg, preflight.open_data(cfg))
    assert f"{cfg.recovery.keep + 2} checkpoints of" in line and model > 26 * 4 * 4


def test_a_run_that_failed_before_its_first_step_leaves_its_out_reusable(data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.toml").write_text("")
    (out / "summary.json").write_text(json.dumps({"status": "failed", "samples": 0}))
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL, "train.max_steps=2"])
    assert run(cfg, out)["status"] == "completed"  # no --overwrite needed
    with pytest.raises(FileExistsError, match="--overwrite"):  # a completed one is kept
        run(cfg, out)


def test_a_diverging_local_run_stops_at_that_step_with_its_summary(data, tmp_path):
    cfg = load_config(None, [f"data.path={json.dumps(str(data))}", *SMALL,
                             "train.dense_lr=1e30", "train.embedding_lr=1e30"])
    with pytest.raises(RunFailed, match=r"loss is (nan|inf) at step (\d+) of the run in mode "
                                        r"'local'") as failed:
        run(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == str(failed.value)
    step = int(str(failed.value).split(" at step ")[1].split()[0])
    assert summary["steps"] == step  # stopped at that step, not later



def test_eager_says_the_measured_gap_of_an_own_update_other_than_the_default(capsys):
    for setting, gap in (("none", "0.055 eval AUC below async"),
                         ("local", "0.011 eval AUC below sync")):
        preflight.warn_caveat(load_config(None, ['mode="eager"', "cluster.workers=2",
                                                 f'eager.own_update="{setting}"']))
        said = capsys.readouterr().err
        assert "warning: mode eager:" in said and gap in said
        assert "docs/benchmarks/2026-11-26-eager-gap.md" in said
    preflight.warn_caveat(load_config(None, ['mode="eager"', "cluster.workers=2"]))
    preflight.warn_caveat(load_config(None, ['mode="eager"', "cluster.workers=2",
                                             'eager.own_update="none"', "eager.overlap=false"]))
    preflight.warn_caveat(load_config(None, ['mode="async"', "cluster.workers=2"]))
    assert capsys.readouterr().err == ""
