"""One Ray instance for the whole integration session (starting Ray costs seconds)."""

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray
    ray.init(include_dashboard=False, object_store_memory=256 * 2**20, num_cpus=2,
             log_to_driver=False)
    yield
    ray.shutdown()
