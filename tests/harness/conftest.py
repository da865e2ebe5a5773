"""The runtime harness: recsync's real actors, queue, worker loop and modes on threads of this
process, with Ray's transport faked (fake_ray.py). Runs take a second or two; no Ray."""

import ast
import functools
import sys
import threading

import pytest

from recsync.data.synthetic import SynthSpec, generate

if sys.version_info < (3, 12):
    # CPython 3.11 keeps the AST builder's recursion depth per interpreter, not per thread: two
    # of the harness's threads parsing at once (numpy reading an .npz header with
    # ast.literal_eval, a traceback being formatted) may fail with "SystemError: AST
    # constructor recursion depth mismatch" (python/cpython#106905). One parse at a time.
    _parse, _parsing = ast.parse, threading.RLock()

    @functools.wraps(_parse)
    def _one_parse_at_a_time(*args, **kwargs):
        with _parsing:
            return _parse(*args, **kwargs)

    ast.parse = _one_parse_at_a_time


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's transport faked for this test; every actor dies at its end."""
    import fake_ray as fr
    runtime = fr.install(monkeypatch)
    yield runtime
    runtime.shutdown()


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """4,096 training rows, 512 eval rows, tables of at most 500 rows (as tests/integration)."""
    root = tmp_path_factory.mktemp("harness_data")
    generate(root, rows=4096, eval_rows=512, spec=SynthSpec(seed=3, max_table_rows=500),
             processes=1, progress=False)
    return root
