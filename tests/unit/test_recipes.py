"""The quickstart's EMULATED cluster: equal machines that fit in the machine's cores."""

import os

import pytest

from recsync.config import load_config
from recsync.recipes import RESERVE_CORES, emulated_cluster


def cores_each(overrides: list[str]) -> float:
    (worker,) = [o for o in overrides if o.startswith("emulation.cores_per_worker=")]
    (shard,) = [o for o in overrides if o.startswith("emulation.cores_per_shard=")]
    assert worker.split("=")[1] == shard.split("=")[1]
    return float(worker.split("=")[1])


@pytest.mark.parametrize("cores, expected", [(2, 0.25), (3, 0.41), (16, 1.0)])
def test_the_cores_left_are_shared_evenly_at_most_one_each(cores, expected):
    each = cores_each(emulated_cluster(4, 2, cores=cores))
    assert each == expected and 6 * each <= cores - RESERVE_CORES


def test_this_machines_config_accepts_the_quickstarts_cluster():
    overrides = emulated_cluster(4, 2)
    cfg = load_config(None, ['mode="sync"', "cluster.workers=4", "cluster.ps_shards=2",
                             *overrides])
    assert cfg.emulation.cores_per_worker == cores_each(overrides) > 0
    assert 6 * cfg.emulation.cores_per_worker <= os.cpu_count() - RESERVE_CORES


def test_too_few_cores_for_the_cluster_is_refused_with_the_counts():
    with pytest.raises(ValueError, match="4 workers and 2 shards"):
        emulated_cluster(4, 2, cores=0)
