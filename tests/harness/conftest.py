"""The runtime harness: recsync's real actors, queue, worker loop and modes on threads of this
process, with Ray's transport faked (fake_ray.py). Runs take a second or two; no Ray."""

import pytest

from recsync.data.synthetic import SynthSpec, generate


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
