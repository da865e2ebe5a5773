"""How a run ends when it does not finish: signals turned into one exception, the known causes
of a failure said in one line, exit codes, and the temporary files a stopped run leaves.

A run installs ``catch_signals`` for its whole length: SIGINT (Ctrl-C), SIGTERM (what a cluster
scheduler and ``docker stop`` send) and SIGHUP (a closed terminal) all raise ``Interrupted``
in the main thread, which the run catches like Ctrl-C: it stops its actors, writes
summary.json (status ``interrupted``) and exits with ``128 + signal number``. Ray's ``init``
installs handlers of its own (a Python SIGTERM handler that calls ``sys.exit``, and its core
worker's C++ handler that dumps a stack and kills the process), so the run installs its
handlers again once Ray is up (``SignalCatcher.install``).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

CAUGHT = ("SIGINT", "SIGTERM", "SIGHUP")

# exit codes of `recsync train` besides 0 and 128 + a signal (README "How a run ends")
EXIT_FAILED, EXIT_USAGE = 1, 2


class Interrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal; ``signal_name`` says which."""

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signal_name))


class NonFiniteLoss(ArithmeticError):
    """The training loss became NaN or infinite: the model is diverging; training stops."""


class SignalCatcher:
    """Raises ``Interrupted`` on the first of SIGINT, SIGTERM, SIGHUP. Later ones only say
    that the run is stopping: an exception in the middle of shutting Ray down or writing the
    summary would lose exactly what the first one asked for (SIGKILL still ends it at once)."""

    def __init__(self):
        self.previous: dict[int, object] = {}
        self.received: str | None = None

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:
            print(f"{name}: already stopping ({self.received}): writing the summary; SIGKILL "
                  f"stops at once", file=sys.stderr, flush=True)
            return
        self.received = name
        raise Interrupted(name)

    def stopping(self, why: str = "the run ended") -> None:
        """From now on a signal only says that the run is stopping (called as soon as the
        run's work ends, however it ends, before Ray is shut down and the summary written)."""
        if self.received is None:
            self.received = why

    def install(self) -> None:
        """Our handlers (again: ray.init installs its own); only the main thread can."""
        import threading
        if threading.current_thread() is not threading.main_thread():
            return
        for name in CAUGHT:
            sig = getattr(signal, name)
            old = signal.signal(sig, self._handle)
            self.previous.setdefault(sig, old)

    def restore(self) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        self.previous.clear()


def keep_signals_from_ray() -> None:
    """Ray's C++ failure handler catches SIGTERM while ray.init runs (a stack dump, then an
    abort, before our handlers are back). This turns it off for the processes of an embedded
    run; Ray's crashes still end the process (without the dump). Ray reads the setting when it
    is imported: the `recsync` command sets it before anything imports Ray; called later (the
    library used from Python, Ray already imported) it only reaches the processes Ray starts."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


@contextlib.contextmanager
def catch_signals():
    """``SignalCatcher`` installed for the block (only in the main thread: elsewhere, e.g. a
    test's thread, signals stay as they are)."""
    catcher = SignalCatcher()
    catcher.install()
    try:
        yield catcher
    finally:
        catcher.restore()


def ending(e: BaseException, received: str | None = None) -> tuple[str, str, BaseException]:
    """(status, cause in one line, what to raise once the summary is written) of the exception
    that ended a run; ``e`` itself is raised again where it is not a run's ending (a
    SystemExit other than Ray's answer to SIGTERM while ray.init runs). ``received``: the
    signal the run's catcher took first, if any: a blocking ``ray.get`` turns the exception
    our handler raised into a plain KeyboardInterrupt, which would read as SIGINT."""
    from recsync.distributed.errors import RunFailed
    if isinstance(e, SystemExit) and e.code != signal.SIGTERM:
        raise e
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        name = getattr(e, "signal_name", None) or (received if received in CAUGHT else None) \
            or ("SIGTERM" if isinstance(e, SystemExit) else "SIGINT")
        return "interrupted", f"{name} received", e if isinstance(e, Interrupted) else \
            Interrupted(name)
    if isinstance(e, RunFailed):  # a worker's unexpected error brings its traceback along
        return "failed", str(e).splitlines()[0], e
    known = known_cause(e)
    if known:
        return "failed", known, RunFailed(known, getattr(e, "record", None))
    cause = f"{type(e).__name__}: {e}".splitlines()[0]  # a bug: its traceback goes along
    trace = "".join(traceback.format_exception(e)).rstrip()
    return "failed", cause, RunFailed(f"{cause}\n{trace}", getattr(e, "record", None))


def ignore_interrupts() -> None:
    """In an actor: leave SIGINT to the driver. Ctrl-C in a terminal reaches every process
    of the foreground group; the driver stops the run and its actors in order, so an actor
    must not die of it on its own (with a stack trace each)."""
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


DISK_ERRNOS = {errno.ENOSPC: "no space left on the device",
               errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system",
               errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted",
               errno.EIO: "input/output error"}


def known_cause(e: BaseException) -> str | None:
    """One line for a failure whose cause is known (a full disk, an unwritable path, a
    diverging model, bad data), None for anything else (a bug: its traceback is kept)."""
    from recsync.data.format import DataFormatError
    from recsync.model.loss import ModelContractError
    for err in _chain(e):
        if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
            where = f" at {err.filename}" if err.filename else ""
            return f"{DISK_ERRNOS[err.errno]}{where} ([Errno {err.errno}])"
        if isinstance(err, ModelContractError):  # a user's model (also as an actor's error)
            return _line_with(str(getattr(err, "cause", err)), "model.name = ")
        if isinstance(err, (NonFiniteLoss, DataFormatError)):
            return str(err).splitlines()[0] if str(err) else type(err).__name__
    text = str(e)
    for code, words in DISK_ERRNOS.items():  # an actor's error, as text
        if f"[Errno {code}]" in text:
            return f"{words}: {_line_with(text, f'[Errno {code}]')}"
    return None


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _line_with(text: str, needle: str) -> str:
    return next((line.strip() for line in text.splitlines() if needle in line), text.strip())


def check_loss(loss: float | None, *, step: int, mode: str, who: str) -> None:
    """Raise NonFiniteLoss if ``loss`` is NaN or infinite (naming the step, mode and who)."""
    if loss is not None and not math.isfinite(loss):
        raise NonFiniteLoss(f"the training loss is {loss} at step {step} of {who} in mode "
                            f"{mode!r}: the model diverged (lower train.dense_lr or "
                            f"train.embedding_lr) or the data holds NaN or inf")


# a run that did not complete: how long its actors, killed, may take to exit (remove_temp_files)
KILLED_WRITER_WAIT_S = 10


def remove_temp_files(out: Path, checkpoints: Path | None, wait_s: float = 0.0) -> list[Path]:
    """Remove what unfinished atomic writes of this run left: ``NAME.json.tmp`` in ``out``,
    a model directory being built there (``.model.tmp-PID``, model_dir/write.py) whose writer
    is gone, and ``.NAME.tmp-PID`` under ``checkpoints`` whose writer (PID) is gone (a
    checkpoint directory may be shared with a live run). ``wait_s``: how long a writer that
    still runs is waited for (a run that failed: its killed actors' processes may take a moment
    to exit after Ray reports them dead). Returns the files removed."""
    found = list(Path(out).glob("*.json.tmp")) if Path(out).is_dir() else []
    if Path(out).is_dir():
        for p in Path(out).glob(".model.tmp-*"):
            if p.is_dir() and not _alive(p):
                shutil.rmtree(p, ignore_errors=True)
    if checkpoints is not None and Path(checkpoints).is_dir():
        temps = list(Path(checkpoints).rglob(".*.tmp-*"))
        deadline = time.monotonic() + wait_s
        while any(_alive(p) for p in temps) and time.monotonic() < deadline:
            time.sleep(0.1)
        found += [p for p in temps if not _alive(p)]
    removed = []
    for p in found:
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def _alive(tmp: Path) -> bool:
    """Whether the process that writes ``tmp`` (``.NAME.tmp-PID``) still runs."""
    try:
        return pid_alive(int(tmp.name.rsplit("-", 1)[1]))
    except ValueError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (this process, a PID of another user's
    process or one we cannot ask about counts as alive: its files are not ours to remove)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # PermissionError: it runs, as another user
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it (Linux; it writes no
    more, though signals still reach it)."""
    try:  # "PID (NAME) STATE ...": NAME may hold spaces and parentheses
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].startswith("Z")
    except (OSError, ValueError):  # gone meanwhile, or no /proc: not known to be a zombie
        return False
