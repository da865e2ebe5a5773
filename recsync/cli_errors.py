"""How every `recsync` command reports a user's error: one line on stderr, exit status 2; and
how a command that writes --out ends on a signal."""

from __future__ import annotations

import contextlib
import sys

import click

from recsync.config_sections import ConfigError
from recsync.run.signals import EXIT_USAGE, Interrupted, catch_signals

USER_ERRORS = (ConfigError, ValueError, FileExistsError, FileNotFoundError)


def fail(e: Exception) -> None:
    click.echo(f"error: {e}", err=True)
    sys.exit(EXIT_USAGE)


@contextlib.contextmanager
def writing(out):
    """A command that writes ``out`` (data, predict, export): its errors in one line; SIGINT,
    SIGTERM and SIGHUP stop it with ``out`` as it was (the staged directory is removed) and
    exit 128 + the signal."""
    try:
        with catch_signals():
            yield
    except Interrupted as e:
        click.echo(f"interrupted by {e.signal_name}: {out} is as it was", err=True)
        sys.exit(e.exit_code)
    except (*USER_ERRORS, OSError) as e:  # OSError: the output cannot be written (disk full)
        fail(e)
