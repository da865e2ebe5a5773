"""recsync.cluster.placement without Ray (the cluster's node table replaced): a request no node or
no cluster total can meet fails at once naming the key and what is missing; "auto" spreads only
on a cluster of several nodes; the actors' options. And recsync.cluster.ray_session: which address a
run joins, and the runtime environment that ships a user's model module."""

import pytest
import ray

from recsync.cluster import placement
from recsync.cluster.ray_session import cluster_address, runtime_env_for, user_module_path
from recsync.config import load_config


def nodes(*resources):
    return [{"NodeID": f"{i:056x}", "NodeManagerAddress": "10.0.0.%d" % i, "Alive": True,
             "Resources": r} for i, r in enumerate(resources)]


@pytest.fixture
def cluster(monkeypatch):
    def use(*resources):
        monkeypatch.setattr(ray, "nodes", lambda: nodes(*resources))
    return use


def test_a_gpu_request_on_a_cluster_without_gpus_names_the_key(cluster):
    cluster({"CPU": 8.0}, {"CPU": 8.0})
    cfg = load_config(None, ['mode="sync"', "cluster.workers=2", "cluster.worker_gpus=1"])
    with pytest.raises(placement.PlacementError, match=r"cluster.worker_gpus = 1: no node .* "
                       r"1 GPU for a worker \(largest: 0; nodes alive: 2\)"):
        placement.check_feasible(cfg, standbys=0)


def test_more_cpus_than_the_cluster_has_in_total_says_what_is_missing(cluster):
    cluster({"CPU": 4.0}, {"CPU": 4.0})
    cfg = load_config(None, ["cluster.workers=4", "cluster.worker_cpus=2",
                             "cluster.ps_shards=2", "cluster.shard_cpus=1"])
    with pytest.raises(placement.PlacementError, match=r"needs 11 CPU .* has 8 CPU: "
                       r"missing 3 CPU"):
        placement.check_feasible(cfg, standbys=1)
    fits = load_config(None, ["cluster.workers=2", "cluster.worker_cpus=2",
                              "cluster.ps_shards=2", "cluster.shard_cpus=1"])
    placement.check_feasible(fits, standbys=2)  # 2 x 2 + 4 x 1 = 8 of 8

def test_a_dead_node_does_not_count(monkeypatch):
    table = nodes({"CPU": 4.0}, {"CPU": 4.0})
    table[1]["Alive"] = False
    monkeypatch.setattr(ray, "nodes", lambda: table)
    cfg = load_config(None, ["cluster.workers=2", "cluster.worker_cpus=3"])
    with pytest.raises(placement.PlacementError, match="missing 2 CPU"):
        placement.check_feasible(cfg, standbys=0)


def test_auto_spreads_only_where_the_cluster_has_several_nodes(cluster):
    cfg = load_config(None, [])
    cluster({"CPU": 2.0})
    assert placement.strategy_for(cfg) == "none"
    cluster({"CPU": 2.0}, {"CPU": 2.0})
    assert placement.strategy_for(cfg) == "spread"
    assert placement.strategy_for(load_config(None, ['cluster.placement="pack"'])) == "pack"


def test_actors_without_a_group_declare_what_the_config_says():
    """And Ray's default strategy, so that a run inside a Ray Tune trial (recsync tune) does not
    place its actors in the trial's placement group, where they would not fit."""
    p = placement.Placement("none", shard_cpus=0.0, worker_cpus=2.0, worker_gpus=1.0)
    assert p.worker(1) == {"num_cpus": 2.0, "num_gpus": 1.0, "scheduling_strategy": "DEFAULT"}
    assert p.shard(0) == {"num_cpus": 0.0, "num_gpus": 0.0, "scheduling_strategy": "DEFAULT"}
    assert p.standby() == p.shard(0)


def test_the_run_joins_ray_address_unless_it_says_local(monkeypatch):
    cfg = load_config(None, [])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(cfg.cluster) is None
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert cluster_address(cfg.cluster) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address(cfg.cluster) == "10.0.0.1:6379"
    cfg = load_config(None, ['cluster.address="auto"'])
    assert cluster_address(cfg.cluster) == "auto"


def test_a_users_model_module_that_is_not_installed_is_shipped(tmp_path, monkeypatch):
    package = tmp_path / "mymodels"
    package.mkdir()
    (package / "__init__.py").write_text("def build(inputs):\n    pass\n")
    (tmp_path / "single.py").write_text("def build(inputs):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.delenv("RECSYNC_STAGING", raising=False)
    assert user_module_path("mymodels:build") == package
    assert user_module_path("single.py:build") == tmp_path / "single.py"
    assert user_module_path("dlrm") is None
    assert user_module_path("numpy:zeros") is None  # installed
    cfg = load_config(None, ['model.name="mymodels:build"',
                             'cluster.runtime_env={pip=["x"], py_modules=["other"]}'])
    assert runtime_env_for(cfg.cluster, cfg.model.name) == {
        "pip": ["x"], "py_modules": ["other", str(package)]}
    monkeypatch.setenv("RECSYNC_STAGING", "/scratch/recsync")  # every process names it alike
    assert runtime_env_for(cfg.cluster, cfg.model.name)["env_vars"] == {
        "RECSYNC_STAGING": "/scratch/recsync"}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # under ray job submit
    assert runtime_env_for(cfg.cluster, cfg.model.name) == {"pip": ["x"],
                                                           "py_modules": ["other"]}
