"""Checkpoints without Ray: atomic files with checksums, a shard's state saved and restored
whole, a writer killed mid-write leaves the previous checkpoint the one loaded, corrupt files
are named with their problem, and nothing is unpickled."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from cores import push as push_async
from cores import test_core
from recsync.checkpoint import files
from recsync.checkpoint.files import CheckpointError
from recsync.checkpoint.writer import CheckpointWriter
from recsync.embedding.row_optim import RowAdagrad
from recsync.embedding.spec import TableSpec
from recsync.ps.core import DenseState

TABLES = [TableSpec("a", 50, 4), TableSpec("b", 30, 4)]


def core(dense_optimizer="adagrad"):
    return test_core(TABLES, RowAdagrad(lr=0.1), shard=1, num_shards=2, num_workers=2, seed=3,
                     dense=DenseState(torch.arange(6, dtype=torch.float32), dense_optimizer,
                                      0.05))


def push(c, step):
    rng = np.random.default_rng(step)
    ids = [np.array([1, 3, 7, 9 + 2 * step]), np.array([5, 11])]
    grads = [rng.normal(size=(len(i), 4)).astype(np.float32) for i in ids]
    push_async(c, ids, grads, rng.normal(size=6).astype(np.float32), version_read=c.version)


def state_of(c):
    ids = [np.arange(1, 50, 2), np.arange(1, 30, 2)]  # every id shard 1 owns
    rows, dense, version = c.pull(ids)
    return rows, dense, version


def test_write_then_load_round_trip_and_latest_is_the_newest(tmp_path):
    a = {"x": np.arange(5, dtype=np.float32), "s": np.array(3.0)}
    files.write(tmp_path, 1, a, {"note": "first"})
    files.write(tmp_path, 2, {"x": a["x"] * 2}, {"note": "second"})
    ckpt = files.latest(tmp_path)
    assert ckpt.sequence == 2 and ckpt.meta == {"note": "second"} and ckpt.skipped == []
    np.testing.assert_array_equal(ckpt.arrays["x"], a["x"] * 2)
    first = files.load(tmp_path / "ckpt-000001.json")
    assert float(first.arrays["s"]) == 3.0
    assert files.latest(tmp_path / "nothing-here") is None


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_a_restored_shard_equals_the_one_saved_and_trains_on_the_same(tmp_path, optimizer):
    saved, twin = core(optimizer), core(optimizer)
    for step in range(3):
        push(saved, step)
        push(twin, step)
    arrays, meta = saved.snapshot()
    files.write(tmp_path, 1, arrays, meta)
    push(saved, 3)  # the live shard goes on; the checkpoint does not change
    restored = core(optimizer)
    restored.restore(*(lambda c: (c.arrays, c.meta))(files.latest(tmp_path)))
    for got, want in zip(state_of(restored)[0], state_of(twin)[0]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(state_of(restored)[1], state_of(twin)[1])
    assert restored.version == twin.version == 3
    assert restored.stats()["pushes"] == 3
    push(restored, 3)  # optimizer state came back too: the same next step
    push(twin, 3)
    for got, want in zip(state_of(restored)[0], state_of(twin)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(state_of(restored)[1], state_of(twin)[1], rtol=1e-6)


def test_restore_forgets_rows_touched_after_the_snapshot(tmp_path):
    c = core()
    push(c, 0)
    arrays, meta = c.snapshot()
    touched = c.store.num_initialized()
    push(c, 5)  # touches row 19 of table a
    assert c.store.num_initialized() > touched
    c.restore(arrays, meta)
    assert c.store.num_initialized() == touched


WRITER_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from recsync.checkpoint import files
    from recsync.checkpoint.writer import CheckpointWriter
    directory = sys.argv[1]
    writer = CheckpointWriter(directory)
    writer.save({"x": np.full(1000, 1.0, np.float32)}, {"n": 1})
    writer.flush()
    real_replace = os.replace
    def stuck(src, dst):  # the second checkpoint's data is renamed, its manifest never is
        if str(dst).endswith("ckpt-000002.json"):
            open(os.path.join(directory, "writing"), "w").close()
            time.sleep(3600)
        real_replace(src, dst)
    files.os.replace = stuck
    writer.save({"x": np.full(1000, 2.0, np.float32)}, {"n": 2})
    time.sleep(3600)
""")


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_the_one_loaded(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(tmp_path)])
    try:
        deadline = time.time() + 60
        while not (tmp_path / "writing").exists():
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "ckpt-000002.npz").exists()  # its data landed, its manifest did not
    assert files.interrupted(tmp_path) == [2]
    ckpt = files.latest(tmp_path)
    assert ckpt.sequence == 1 and ckpt.meta == {"n": 1}
    np.testing.assert_array_equal(ckpt.arrays["x"], np.full(1000, 1.0, np.float32))


def test_a_write_stopped_before_its_manifest_is_reported_as_interrupted(tmp_path):
    """The writer's fault hook runs between the data file and the manifest."""
    files.write(tmp_path, 1, {"x": np.zeros(10, np.float32)}, {"n": 1})

    def crash():
        raise SystemExit("crashed")
    with pytest.raises(SystemExit):
        files.write(tmp_path, 2, {"x": np.ones(10, np.float32)}, {"n": 2}, before_manifest=crash)
    assert files.interrupted(tmp_path) == [2]
    assert files.latest(tmp_path).sequence == 1
    files.write(tmp_path, 2, {"x": np.ones(10, np.float32)}, {"n": 2})  # written again
    assert files.interrupted(tmp_path) == [] and files.latest(tmp_path).sequence == 2


def _two_checkpoints(tmp_path):
    files.write(tmp_path, 1, {"x": np.zeros(100, np.float32)}, {})
    files.write(tmp_path, 2, {"x": np.ones(100, np.float32)}, {})
    return tmp_path / "ckpt-000002.npz", tmp_path / "ckpt-000002.json"


def test_a_corrupt_data_file_is_named_and_the_previous_checkpoint_is_used(tmp_path):
    data, manifest = _two_checkpoints(tmp_path)
    raw = bytearray(data.read_bytes())
    raw[-40] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"ckpt-000002\.npz: checksum mismatch"):
        files.load(manifest)
    ckpt = files.latest(tmp_path)
    assert ckpt.sequence == 1 and "checksum mismatch" in ckpt.skipped[0]


@pytest.mark.parametrize("damage, problem", [
    ("truncate_manifest", r"ckpt-000002\.json: the manifest is not valid JSON"),
    ("truncate_data", r"ckpt-000002\.npz: \d+ bytes, the manifest says"),
    ("remove_data", r"ckpt-000002\.npz: the data file of checkpoint ckpt-000002\.json is "
                    r"missing"),
])
def test_partial_checkpoints_are_reported_with_file_and_problem(tmp_path, damage, problem):
    data, manifest = _two_checkpoints(tmp_path)
    if damage == "truncate_manifest":
        manifest.write_text(manifest.read_text()[:30])
    elif damage == "truncate_data":
        data.write_bytes(data.read_bytes()[:50])
    else:
        data.unlink()
    with pytest.raises(CheckpointError, match=problem):
        files.load(manifest)
    assert files.latest(tmp_path).sequence == 1


def test_no_complete_checkpoint_at_all_is_an_error_listing_why(tmp_path):
    data, manifest = _two_checkpoints(tmp_path)
    for m in tmp_path.glob("*.json"):
        m.write_text("{")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        files.latest(tmp_path)


def test_loading_never_unpickles(tmp_path):
    """A data file holding a pickled object, with a manifest whose checksum matches it."""
    data = tmp_path / "ckpt-000001.npz"
    np.savez(data, evil=np.array([{"a": 1}], dtype=object))
    manifest = {"format": files.FORMAT, "format_version": files.FORMAT_VERSION,
                "sequence": 1, "data_file": data.name, "bytes": data.stat().st_size,
                "sha256": hashlib.sha256(data.read_bytes()).hexdigest(), "meta": {}}
    (tmp_path / "ckpt-000001.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot be read as numeric arrays"):
        files.load(tmp_path / "ckpt-000001.json")


def test_the_writer_writes_in_the_background_keeps_the_newest_and_reports_failures(tmp_path):
    writer = CheckpointWriter(tmp_path, keep=2)
    for n in range(4):
        assert writer.save({"x": np.full(10, n, np.float32)}, {"n": n}) == n + 1
    writer.flush()
    assert [p.name for p in files.manifests(tmp_path)] == ["ckpt-000004.json",
                                                            "ckpt-000003.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000003.json", "ckpt-000003.npz", "ckpt-000004.json", "ckpt-000004.npz"]
    assert [w["sequence"] for w in writer.written] == [1, 2, 3, 4]
    writer.save({"bad": np.array([object()], dtype=object)}, {})
    with pytest.raises(RuntimeError, match="writing a checkpoint .* failed"):
        writer.flush()
    writer.close()
    assert files.latest(tmp_path).sequence == 4
    again = CheckpointWriter(tmp_path, keep=2)  # a new writer continues the numbering
    assert again.save({"x": np.zeros(1, np.float32)}, {}) == 5  # after the newest on disk
    again.close()
    assert files.latest(tmp_path).sequence == 5


def test_a_snapshot_from_before_the_shard_rules_is_refused_with_a_clear_error():
    c = core("adagrad")
    arrays, meta = c.snapshot()
    old = {k: v for k, v in meta.items() if k not in ("rule", "mode")}
    with pytest.raises(ValueError, match="before the modes' shard rules"):
        core("adagrad").restore(arrays, {**old, "gba_counts": {}, "easgd_pushes": 0})
