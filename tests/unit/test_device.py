"""recsync.cluster.device: a worker's device from the config, a clear error where a GPU is asked for
and none is seen, optimizer states brought to host memory before they cross processes, and
the collective backend per device. (The GPU runs themselves: tests/integration/test_gpu.py.)"""

import pytest
import torch

from recsync.cluster.device import group_backend, host, on_host, worker_device
from recsync.config import load_config


def test_a_worker_without_gpus_computes_on_the_cpu():
    assert worker_device(load_config(None, ['mode="sync"'])) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_asked_for_and_not_seen_is_named():
    cfg = load_config(None, ['mode="sync"', "cluster.worker_gpus=1"])
    with pytest.raises(RuntimeError, match="cluster.worker_gpus = 1, but this worker sees no "
                                           "CUDA device"):
        worker_device(cfg)


def test_optimizer_states_come_to_host_whatever_their_nesting():
    state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
             "param_groups": [{"lr": 0.1, "params": [0]}]}
    out = on_host(state)
    assert out["state"][0]["exp_avg"].device.type == "cpu" and out["param_groups"] == [
        {"lr": 0.1, "params": [0]}]
    assert host(torch.ones(2, requires_grad=True)).tolist() == [1.0, 1.0]


def test_groups_of_gpu_workers_use_nccl():
    assert group_backend(torch.device("cpu")) == "gloo"
    assert group_backend(torch.device("cuda", 0)) == "nccl"


def test_modes_that_train_on_the_cpu_refuse_gpus():
    from recsync.run.preflight import check_gpu_mode
    for mode in ("shadow", "foreground", "local"):
        with pytest.raises(ValueError, match=f"mode '{mode}' trains on the CPU; GPU workers "
                                             f"run modes sync, async, gba, eager, hybrid"):
            check_gpu_mode(load_config(None, [f'mode="{mode}"', "cluster.worker_gpus=1"]))
    check_gpu_mode(load_config(None, ['mode="hybrid"', "cluster.worker_gpus=1"]))
