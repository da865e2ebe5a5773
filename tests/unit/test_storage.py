"""recsync.cluster.storage on fsspec's in-memory filesystem (memory://): a URL's staging folder and
back, fetching only what is missing, uploading a run's folder, and checkpoints that go up as
they are written (the data file before its manifest) and are deleted there when pruned."""

import fsspec
import numpy as np
import pytest

from recsync.checkpoint import files
from recsync.checkpoint.writer import CheckpointWriter
from recsync.cluster import storage


@pytest.fixture
def staging(tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYNC_STAGING", str(tmp_path / "staging"))
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    return tmp_path / "staging"


def test_a_url_and_its_staging_folder_name_each_other(staging):
    assert storage.local("s3://bucket/runs/a") == staging / "s3" / "bucket" / "runs" / "a"
    assert storage.remote_of(staging / "s3" / "bucket" / "runs" / "a" / "x.json") == \
        "s3://bucket/runs/a/x.json"
    assert storage.local("file:///data/x") == storage.local("/data/x")
    assert storage.remote_of("/data/x") is None and not storage.is_url("file:///data/x")
    with pytest.raises(ValueError, match="not a URL of a folder"):
        storage.local("s3://bucket/../x")


def test_pull_fetches_what_is_missing_or_of_another_size(staging):
    fs = fsspec.filesystem("memory")
    fs.pipe({"/b/d/meta.json": b"{}", "/b/d/part-0/x.npy": b"12345"})
    folder = storage.local("memory://b/d")
    assert storage.pull_dir(folder) == 2
    assert (folder / "part-0" / "x.npy").read_bytes() == b"12345"
    assert storage.pull_dir(folder) == 0  # nothing new
    fs.pipe("/b/d/part-0/x.npy", b"123456")
    assert storage.pull_dir(folder) == 1
    assert storage.local_data("memory://b/d") == folder
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        storage.local_data("memory://b/empty")


def test_push_tree_uploads_a_runs_folder_but_not_its_temporary_files(staging):
    out = storage.local("memory://b/run")
    (out / "model").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    (out / "model" / "model.json").write_text("{}")
    (out / ".summary.json.tmp-1").write_text("partial")
    assert storage.push_tree(out) == 2
    assert storage.remote_names(out) == {"summary.json", "model"}
    storage.remove_tree(out, {"model"})
    assert storage.remote_names(out) == {"summary.json"}


def test_checkpoints_go_up_as_written_and_are_removed_there_when_pruned(staging,
                                                                      monkeypatch):
    fs = fsspec.filesystem("memory")
    pushed = []
    push = storage.push
    monkeypatch.setattr(storage, "push", lambda paths: (pushed.append(
        [p.name for p in paths]), push(paths)))
    directory = storage.local("memory://b/run/checkpoints/shard-0")
    writer = CheckpointWriter(directory, keep=2)
    for i in range(3):
        writer.save({"w": np.full(4, i, np.float32)}, {"i": i})
    writer.close()
    up = sorted(p.rpartition("/")[2] for p in fs.find("/b/run/checkpoints/shard-0"))
    assert up == ["ckpt-000002.json", "ckpt-000002.npz", "ckpt-000003.json", "ckpt-000003.npz"]
    assert pushed[0] == ["ckpt-000001.npz", "ckpt-000001.json"]  # complete iff manifest
    for f in directory.iterdir():  # as on another node: nothing here, loaded from the URL
        f.unlink()
    storage.pull_dir(directory)
    assert files.latest(directory).meta == {"i": 2}


def test_metrics_at_a_url_go_up_as_the_run_writes_them(staging, monkeypatch, capsys):
    from recsync.metrics.core import MetricsLog

    folder = storage.local("memory://b/run")
    folder.mkdir(parents=True)
    log = MetricsLog(folder / "metrics.jsonl", upload_every_s=0.0)
    log.write({"samples": 1})
    log.write({"samples": 2})
    fs = fsspec.filesystem("memory")
    assert fs.cat("/b/run/metrics.jsonl").decode().splitlines() == ['{"samples": 1}',
                                                                    '{"samples": 2}']
    # an upload that fails: said once, the run goes on, the next one catches up
    monkeypatch.setattr(storage, "push", lambda paths: (_ for _ in ()).throw(OSError("down")))
    log.write({"samples": 3})
    log.write({"samples": 4})
    assert capsys.readouterr().err.count("could not upload metrics.jsonl") == 1
    monkeypatch.undo()
    monkeypatch.setenv("RECSYNC_STAGING", str(staging))
    log.write({"samples": 5})
    log.close()
    assert len(fs.cat("/b/run/metrics.jsonl").decode().splitlines()) == 5
    assert log.upload_error is None


def test_a_new_run_at_a_url_refuses_an_earlier_runs_outputs_as_a_local_out_does(staging):
    from recsync.run.driver import check_remote_out

    fs = fsspec.filesystem("memory")
    out = storage.local("memory://b/run")
    fs.pipe({"/b/run/summary.json": b'{"status": "completed", "samples": 4096}',
             "/b/run/metrics.jsonl": b"{}\n"})
    with pytest.raises(FileExistsError, match=r"memory://b/run already holds .*--overwrite"):
        check_remote_out(out, overwrite=False, resume=False)
    assert fs.exists("/b/run/summary.json")  # nothing removed
    # an earlier run that trained nothing (stopped before its first step) is replaced
    fs.pipe({"/b/run/summary.json": b'{"status": "interrupted", "samples": 0}'})
    check_remote_out(out, overwrite=False, resume=False)
    assert not fs.exists("/b/run/summary.json") and not fs.exists("/b/run/metrics.jsonl")


def test_outputs_only_in_the_staging_folder_are_not_thrown_away(staging):
    """An upload that failed leaves the run's outputs in the staging folder only."""
    from recsync.run.driver import check_remote_out

    out = storage.local("memory://b/run")
    out.mkdir(parents=True)
    (out / "summary.json").write_text('{"status": "completed", "samples": 4096}')
    with pytest.raises(FileExistsError, match=r"staging folder of memory://b/run.*not at the URL"):
        check_remote_out(out, overwrite=False, resume=False)
    assert (out / "summary.json").exists()
    check_remote_out(out, overwrite=True, resume=False)
    assert not out.exists()
