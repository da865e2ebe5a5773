"""How a run ends, without Ray: signals become one Interrupted (a second only says the run is
stopping), each ending's status and one-line cause, temporary files removed."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from recsync.data.format import DataFormatError
from recsync.distributed.errors import RunFailed
from recsync.run.signals import (Interrupted, NonFiniteLoss, catch_signals, check_loss, ending,
                              known_cause, remove_temp_files)


def _wait_for_signal():
    deadline = time.time() + 5
    while time.time() < deadline:  # the handler runs between bytecodes
        time.sleep(0.01)
    raise AssertionError("no signal arrived")


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_the_first_signal_interrupts_and_a_second_only_says_so(name, code, capsys):
    before = signal.getsignal(signal.SIGTERM)
    with catch_signals():
        with pytest.raises(Interrupted) as stopped:
            os.kill(os.getpid(), getattr(signal, name))
            _wait_for_signal()
        assert stopped.value.signal_name == name and stopped.value.exit_code == code
        os.kill(os.getpid(), signal.SIGTERM)  # while stopping: printed, not raised
        time.sleep(0.05)
    assert "already stopping" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before  # the handler before is back


def test_each_ending_has_its_status_and_one_line_cause():
    assert ending(Interrupted("SIGTERM"))[:2] == ("interrupted", "SIGTERM received")
    status, cause, raised = ending(KeyboardInterrupt())
    assert (status, cause) == ("interrupted", "SIGINT received")
    assert isinstance(raised, Interrupted) and raised.exit_code == 130
    # a SIGTERM the run's catcher took, raised again by a blocking ray.get as a plain
    # KeyboardInterrupt, is still a SIGTERM
    status, cause, raised = ending(KeyboardInterrupt(), received="SIGTERM")
    assert cause == "SIGTERM received" and raised.exit_code == 143
    assert ending(KeyboardInterrupt(), received="the run ended")[1] == "SIGINT received"
    # Ray's own SIGTERM handler (installed while ray.init runs) calls sys.exit(15)
    assert ending(SystemExit(signal.SIGTERM))[:2] == ("interrupted", "SIGTERM received")
    with pytest.raises(SystemExit):
        ending(SystemExit(0))
    failed = RunFailed("shard 1 died")
    assert ending(failed) == ("failed", "shard 1 died", failed)
    full = OSError(errno.ENOSPC, "No space left on device", "/out/ckpt-000003.npz")
    status, cause, raised = ending(full)
    assert cause == "no space left on the device at /out/ckpt-000003.npz ([Errno 28])"
    assert isinstance(raised, RunFailed) and str(raised) == cause
    try:
        raise ValueError("shapes (2,) and (3,)\nmore detail")
    except ValueError as bug:  # a bug: a failed run (exit 1) whose message keeps the traceback
        status, cause, raised = ending(bug)
    assert (status, cause) == ("failed", "ValueError: shapes (2,) and (3,)")
    assert isinstance(raised, RunFailed) and "Traceback (most recent call last)" in str(raised)


def test_known_causes_are_found_in_an_actors_error_text_and_a_chain():
    ray_text = RuntimeError("ray::PSShard.checkpoint() (pid=1)\n  File x\nRuntimeError: writing "
                            "a checkpoint into /c failed: [Errno 28] No space left on device")
    assert known_cause(ray_text).startswith("no space left on the device: RuntimeError: writing")
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/ro/metrics.jsonl")
        except OSError as inner:
            raise RuntimeError("could not log") from inner
    except RuntimeError as outer:
        assert known_cause(outer) == "read-only file system at /ro/metrics.jsonl ([Errno 30])"
    assert known_cause(DataFormatError("part-00001.sparse.npy: row 3 ...")) == \
        "part-00001.sparse.npy: row 3 ..."
    assert known_cause(ValueError("a bug")) is None


def test_a_non_finite_loss_names_step_mode_and_worker():
    check_loss(0.69, step=3, mode="sync", who="worker 1")
    check_loss(None, step=3, mode="sync", who="worker 1")  # a step that trained nothing
    for bad in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteLoss, match=r"loss is (nan|inf) at step 3 of worker 1 in "
                                                r"mode 'sync'"):
            check_loss(bad, step=3, mode="sync", who="worker 1")


def test_temporary_files_of_unfinished_writes_are_removed_and_nothing_else(tmp_path):
    shard = tmp_path / "checkpoints" / "shard-0"
    shard.mkdir(parents=True)
    dead = 2**22 + 12345  # above Linux's default pid_max: no such process
    tmp = [shard / f".ckpt-000002.npz.tmp-{dead}", tmp_path / "summary.json.tmp"]
    keep = [shard / "ckpt-000001.npz", shard / "ckpt-000001.json", tmp_path / "notes.tmp.txt",
            shard / f".ckpt-000003.npz.tmp-{os.getpid()}",  # a live writer's (a shared dir)
            tmp_path / "sub" / "summary.json.tmp"]  # --out is not searched below its top
    (tmp_path / "sub").mkdir()
    for p in (*tmp, *keep):
        p.write_text("x")
    assert sorted(remove_temp_files(tmp_path, tmp_path / "checkpoints")) == sorted(tmp)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in tmp)



def test_a_killed_writers_temporary_file_is_removed_once_it_has_exited(tmp_path):
    """A failed run's shard, killed mid-write, may outlive Ray's report of its death: the
    driver waits for it; a process that exited but is not reaped yet (a zombie) writes no more."""
    shard = tmp_path / "checkpoints" / "shard-1"
    shard.mkdir(parents=True)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        tmp = shard / f".ckpt-000003.npz.tmp-{writer.pid}"
        tmp.write_text("x")
        assert remove_temp_files(tmp_path, tmp_path / "checkpoints") == []  # it still runs
        assert remove_temp_files(tmp_path, tmp_path / "checkpoints", wait_s=30) == [tmp]
        assert writer.poll() is not None and not tmp.exists()
    finally:
        writer.kill()
        writer.wait()

def test_a_user_models_broken_forward_ends_in_its_one_line_also_from_an_actor():
    from ray.exceptions import RayTaskError

    from recsync.model.loss import ModelContractError
    line = ("model.name = 'my.py:build': forward(dense, embeddings) returned a torch.int64 "
            "tensor of shape [4]; the contract is floating-point logits of shape [B] = [4]")
    assert known_cause(ModelContractError(line)) == line
    try:
        raise ModelContractError(line)
    except ModelContractError as cause:  # as Ray hands an actor's error to the driver
        from_actor = RayTaskError("Worker.run", "Traceback ...", cause).as_instanceof_cause()
    assert isinstance(from_actor, ModelContractError)
    status, cause, raised = ending(from_actor)
    assert (status, cause) == ("failed", line) and "Traceback" not in str(raised)
