"""One Ray instance for the whole integration session (starting Ray costs seconds), and one
small synthetic data set."""

import pytest

from recsync.data.synthetic import SynthSpec, generate


@pytest.fixture(scope="session")
def ray_cluster():
    """On loopback, as recsync's embedded default; its session folder removed at the end."""
    from pathlib import Path

    import ray

    from recsync.cluster.ray_session import loopback_node, remove_session
    with loopback_node():
        ctx = ray.init(include_dashboard=False, object_store_memory=256 * 2**20, num_cpus=2,
                       log_to_driver=False)
    yield
    ray.shutdown()
    remove_session(Path(ctx.address_info["session_dir"]))


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """4,096 training rows, 512 eval rows, tables of at most 500 rows."""
    root = tmp_path_factory.mktemp("data")
    generate(root, rows=4096, eval_rows=512, spec=SynthSpec(seed=3, max_table_rows=500),
             processes=1, progress=False)
    return root
