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


# -- a checkpoint folder from elsewhere (issue 29): nothing in a manifest is trusted ----------

class Hang(BaseException):
    """Not an Exception: no ``except Exception`` in the code under test takes it."""


def _within(seconds, fn):
    """``fn()``, failed (Hang) if it runs longer than ``seconds``: a hang fails."""
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _edit(manifest, edit, keep_digest=False):
    """Rewrite a manifest's JSON with ``edit(dict)`` (dropping meta_sha256 unless told: as
    an older recsync's manifest, or one whose editor knew to drop it)."""
    m = json.loads(manifest.read_text())
    edit(m)
    if not keep_digest:
        m.pop("meta_sha256", None)
    manifest.write_text(json.dumps(m))


def _refused(manifest, *needles):
    with pytest.raises(CheckpointError) as e:
        _within(5, lambda: files.load(manifest))
    assert "\n" not in str(e.value)
    for needle in (manifest.name, *needles):
        assert needle in str(e.value), (needle, str(e.value))
    return str(e.value)


@pytest.mark.parametrize("data_file", ["/dev/zero", "../other/ckpt-000002.npz",
                                       "ckpt-000001.npz", "/etc/passwd", "sub/ckpt-000002.npz"])
def test_a_data_file_other_than_the_checkpoints_own_is_refused_at_once(tmp_path, data_file):
    data, manifest = _two_checkpoints(tmp_path)
    _edit(manifest, lambda m: m.update(data_file=data_file, bytes=0))  # /dev/zero: 0 bytes
    began = time.perf_counter()
    _refused(manifest, "data_file", "not ckpt-000002.npz")
    assert time.perf_counter() - began < 1.0
    assert files.latest(tmp_path).sequence == 1


def test_a_data_file_symlink_leading_out_is_refused_and_what_it_names_never_opened(tmp_path):
    folder, other = tmp_path / "ckpt", tmp_path / "other"
    other.mkdir()
    data, manifest = _two_checkpoints(folder)
    copy = other / "ckpt-000002.npz"  # a valid copy: the old loader read it and accepted it
    copy.write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(copy)
    _refused(manifest, "leads outside")
    fifo = other / "fifo"  # opening it would block: refused before any open
    os.mkfifo(fifo)
    data.unlink()
    data.symlink_to(fifo)
    _refused(manifest, "leads outside")
    data.unlink()
    data.symlink_to(data)  # a loop
    _refused(manifest, "cannot be resolved")


def test_a_fifo_or_folder_in_place_of_a_data_file_or_manifest_is_refused_without_blocking(
        tmp_path):
    data, manifest = _two_checkpoints(tmp_path)
    size = data.stat().st_size
    data.unlink()
    os.mkfifo(data)
    _edit(manifest, lambda m: m.update(bytes=0), keep_digest=True)
    _refused(manifest, "not a regular file")
    data.unlink()
    data.mkdir()
    _refused(manifest, "not a regular file")
    assert size > 0
    manifest.unlink()
    os.mkfifo(manifest)
    _refused(manifest, "not a regular file")
    assert _within(5, lambda: files.latest(tmp_path)).sequence == 1
    _within(5, lambda: files.prune(tmp_path, keep=1))  # reads manifests too


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m.update(meta=[]), "meta is [], not an object"),
    (lambda m: m["meta"].update(base={}), "meta['base'] is {}"),
    (lambda m: m["meta"].update(base=5), "meta['base'] is 5, not an integer in [1, 2]"),
    (lambda m: m["meta"].update(shard_sequences="12"), "meta['shard_sequences']"),
    (lambda m: m["meta"].update(shard_sequences=[1, "2"]), "meta['shard_sequences'] [1]"),
    (lambda m: m["meta"].update(final="no"), "meta['final'] is no, not true or false"),
    (lambda m: m["meta"].update(config=[]), "meta['config']"),
    (lambda m: m["meta"].update(queue={"pending": []}), "meta['queue'] lacks 'leased'"),
    (lambda m: m["meta"].update(tables=10**30), "meta['tables']"),
    (lambda m: m["meta"].update(partial="mfu"), "has no 'base'"),
    (lambda m: m["meta"].update(queue={"pending": [[0, "train", 0, 0, 8, 9]], "leased": [],
                                       "completed": [], "by_worker": {}}),
     "[0, 'train', 0, 0, 8, 9], not a list of 5"),
    (lambda m: m["meta"].update(queue={"pending": [], "leased": [], "by_worker": {},
                                       "completed": [[[0, "train", 0, 0, 8], 1, 7]]}),
     "not a list of 2"),
    (lambda m: m.update(sequence=1), "sequence is 1, not the one its name says"),
    (lambda m: m.update(meta={"a\x1b[2J": 1, "staleness": {"\x07": 1}}),
     "has key \\x07, not a decimal number"),
])
def test_a_meta_field_of_the_wrong_type_is_one_line_naming_the_manifest_and_key(
        tmp_path, edit, needle):
    data, manifest = _two_checkpoints(tmp_path)
    _edit(manifest, edit)
    message = _refused(manifest, needle)
    assert "\x1b" not in message and "\x07" not in message


def test_a_compressed_data_file_that_would_inflate_is_refused(tmp_path):
    data, manifest = _two_checkpoints(tmp_path)
    np.savez_compressed(data, x=np.zeros((2000, 2000), np.float32))  # 16 MB from a few KB
    _edit(manifest, lambda m: m.update(bytes=data.stat().st_size,
                                       sha256=hashlib.sha256(data.read_bytes()).hexdigest()),
          keep_digest=True)
    with pytest.raises(CheckpointError, match=r"ckpt-000002\.npz: holds compressed or "
                                              r"oversized members"):
        _within(5, lambda: files.load(manifest))
    assert files.latest(tmp_path).sequence == 1


def test_a_meta_edited_after_it_was_written_no_longer_matches_its_checksum(tmp_path):
    data, manifest = _two_checkpoints(tmp_path)
    _edit(manifest, lambda m: m["meta"].update(note="edited"), keep_digest=True)
    _refused(manifest, "the meta does not match meta_sha256")
    _edit(manifest, lambda m: None)  # an older recsync's manifest: no meta_sha256, accepted
    assert files.load(manifest).meta == {"note": "edited"}


def _job_run(tmp_path):
    from recsync.checkpoint import job
    from recsync.config import RunConfig
    cfg = RunConfig(mode="gba", recovery={"checkpoint_every_s": 1.0})
    root = tmp_path / "checkpoints"
    files.write(job.shard_dir(root, 0), 1, {"x": np.zeros(1, np.float32)}, {})
    manifest = files.write(job.job_dir(root), 1, {}, {"final": False, "shard_sequences": [1],
                                                       "config": cfg.model_dump(mode="json")})
    return cfg, manifest


def test_resume_refuses_a_job_checkpoint_whose_config_was_deleted(tmp_path):
    from recsync.run.driver import resume_point
    cfg, manifest = _job_run(tmp_path)
    _edit(manifest, lambda m: m["meta"].pop("config"), keep_digest=True)
    with pytest.raises(ValueError, match=r"no complete job checkpoint to resume from .*"
                                         r"ckpt-000001\.json: the meta does not match "
                                         r"meta_sha256") as e:
        resume_point(cfg, tmp_path)
    assert "\n" not in str(e.value)


def test_resume_of_a_job_checkpoint_without_final_is_one_line_naming_it(tmp_path):
    from recsync.run.driver import resume_point
    cfg, manifest = _job_run(tmp_path)
    _edit(manifest, lambda m: m["meta"].pop("final"))  # and its checksum: an older manifest
    with pytest.raises(CheckpointError, match=r"job/ckpt-000001\.json: meta lacks 'final'"):
        resume_point(cfg, tmp_path)
