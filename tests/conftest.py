"""Fixtures for every test directory."""

import asyncio
import subprocess
import threading

import pytest


@pytest.fixture
def loop():
    """An asyncio loop running in a thread of its own (as a PSShard actor's), stopped after."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


@pytest.fixture
def mount_tmpfs(tmp_path):
    """``mount_tmpfs(options)``: a tmpfs mounted in a fresh directory (e.g. "size=20m", or
    "ro,size=1m": a read-only file system, which stops root where permissions do not);
    unmounted at the end. Skips the test where mounting is not allowed."""
    mounted = []

    def mount(options: str):
        path = tmp_path / f"tmpfs{len(mounted)}"
        path.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="session")
def dyn_data(tmp_path_factory):
    """A data set whose tables are dynamic (tests/dynamic_data.py)."""
    import dynamic_data
    return dynamic_data.write(tmp_path_factory.mktemp("dynamic_data"))
