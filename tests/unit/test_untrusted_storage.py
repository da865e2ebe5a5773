"""Names and addresses from outside (issue 29): a remote listing whose keys would land outside
the staging folder is refused whole with nothing written; names to delete or upload stay in
their folder; ``--resume file:///DIR`` is ``--resume DIR``; a bad ``--out`` URL, S3 without
credentials or an unreachable endpoint, and a config nested too deeply are one-line errors."""

import os

import fsspec
import pytest
from click.testing import CliRunner

from recsync.cli import main
from recsync.cluster import storage
from recsync.config import ConfigError, RunConfig, load_config
from recsync.safe_names import UnsafeName


@pytest.fixture
def staging(tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYNC_STAGING", str(tmp_path / "a" / "b" / "staging"))
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    return tmp_path / "a" / "b" / "staging"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_user_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("key", ["run/../../../escape1.txt", "run/sub/../../escape1.txt",
                                 "run//escape1.txt", "run/x\x1b[2Jy.txt"])
def test_a_listing_key_leading_out_of_the_staging_folder_is_refused_and_nothing_written(
        staging, tmp_path, key):
    fs = fsspec.filesystem("memory")
    fs.pipe({"/bucket/run/ok.txt": b"ok", f"/bucket/{key}": b"attacker"})
    folder = storage.local("memory://bucket/run")
    with pytest.raises(UnsafeName) as e:
        storage.pull_dir(folder)
    message = str(e.value)
    assert "memory://bucket/run" in message and "nothing fetched" in message
    assert "\n" not in message and "\x1b" not in message
    assert not list(tmp_path.rglob("escape1.txt"))  # nowhere, inside or out
    assert not (folder / "ok.txt").exists()  # the whole fetch refused


def test_a_symlink_in_the_staging_folder_does_not_lead_a_fetch_out(staging, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = storage.local("memory://bucket/run")
    folder.mkdir(parents=True)
    (folder / "sub").symlink_to(outside)
    fsspec.filesystem("memory").pipe({"/bucket/run/sub/x.txt": b"attacker"})
    with pytest.raises(UnsafeName, match=r"memory://bucket/run.*leads outside"):
        storage.pull_dir(folder)
    assert not (outside / "x.txt").exists()


def test_names_to_delete_and_files_to_upload_stay_in_their_folder(staging, tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe({"/bucket/keep.txt": b"other run", "/bucket/run/summary.json": b"{}"})
    out = storage.local("memory://bucket/run")
    for bad in ("..", "a/b", "", "/bucket"):
        with pytest.raises(UnsafeName, match="memory://bucket/run: names to delete"):
            storage.remove_tree(out, {"summary.json", bad})
    assert fs.exists("/bucket/keep.txt") and fs.exists("/bucket/run/summary.json")
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's")
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "linked.txt").symlink_to(secret)
    assert storage.push_tree(out) == 1  # metrics.jsonl; the symlink leading out stays here
    assert not fs.exists("/bucket/run/linked.txt")


def test_resume_accepts_a_file_url_as_the_folder_it_names(staging, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(RunConfig(mode="local").to_toml())
    assert storage.resume_folder(f"file://{run}") == run == storage.resume_folder(run)
    # as `--resume DIR` does: the run is read (a local run: nothing to resume from)
    one_line_user_error(invoke("train", "--resume", f"file://{run}"),
                        "the run wrote no checkpoints to resume from")
    one_line_user_error(invoke("train", "--resume", f"file://{tmp_path}/none"),
                        f"--resume file://{tmp_path}/none: no such directory")


def test_an_out_url_leading_up_is_a_one_line_error(staging):
    one_line_user_error(invoke("train", "--out", "memory://bucket/../x"),
                        "memory://bucket/../x: not a URL of a folder")


@pytest.fixture
def no_aws(monkeypatch):
    """S3 at a loopback port nothing listens on, no credentials from anywhere (nor the
    instance metadata service: no traffic leaves the machine), one attempt."""
    s3fs = pytest.importorskip("s3fs")
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    yield monkeypatch
    s3fs.S3FileSystem.clear_instance_cache()


def test_s3_without_credentials_is_one_line_naming_the_url_and_what_is_missing(staging,
                                                                               no_aws):
    one_line_user_error(invoke("train", "--out", "s3://bucket/run"),
                        "s3://bucket/run: cannot list it: no credentials for s3://",
                        "AWS_ACCESS_KEY_ID")
    with pytest.raises(storage.RemoteError, match=r"s3://bucket/data: cannot fetch it: no "
                                                  r"credentials"):
        storage.local_data("s3://bucket/data")


def test_an_unreachable_s3_endpoint_is_one_line_naming_the_url(staging, no_aws):
    no_aws.setenv("AWS_ACCESS_KEY_ID", "test")
    no_aws.setenv("AWS_SECRET_ACCESS_KEY", "test")
    one_line_user_error(invoke("train", "--out", "s3://bucket/run"),
                        "s3://bucket/run: cannot list it:", "127.0.0.1:9")


@pytest.mark.parametrize("text", ["a = " + "[" * 10_000 + "]" * 10_000,
                                  "a = " + "{b = " * 5_000 + "1" + "}" * 5_000,
                                  "[model.params." + ".".join(["x"] * 3_000) + "]\n"])
def test_a_config_nested_too_deeply_is_one_line_naming_the_file(tmp_path, text):
    path = tmp_path / "deep.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="nested") as e:
        load_config(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="--set model.params.a: .*nested"):
        load_config(None, ["model.params.a=" + "[" * 10_000 + "]" * 10_000])
    result = invoke("train", "--config", path, "--out", tmp_path / "out")
    one_line_user_error(result, str(path), "nested")


def test_a_listing_name_that_is_not_plain_is_left_out_of_the_names_at_a_url(staging):
    fs = fsspec.filesystem("memory")
    fs.pipe({"/bucket/run/summary.json": b"{}", "/bucket/run/a\x1bb": b"x"})
    assert storage.remote_names(storage.local("memory://bucket/run")) == {"summary.json"}
