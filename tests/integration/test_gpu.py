"""GPU workers (cluster.worker_gpus > 0): the dense model and the pulled rows on the GPU,
sync's all-reduce on NCCL, the shards on CPU; on a small model a run's results equal the CPU
run's within float tolerance. Skipped where torch sees no CUDA device (CI); run them on a GPU
machine: `.venv/bin/python -m pytest -q tests/integration/test_gpu.py`."""

import pytest
import torch

from recsync.run.driver import run
from runs import config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _pair(data, tmp_path, *overrides, gpus: float):
    """The same run on CPU and GPU workers, both in float32: "auto" would be bfloat16 on a
    GPU and on a CPU with AMX, whose rounding differs between the two devices."""
    overrides = (*overrides, 'train.dense_precision="float32"')
    cpu = run(config(data, *overrides), tmp_path / "cpu")
    gpu = run(config(data, *overrides, f"cluster.worker_gpus={gpus}"), tmp_path / "gpu")
    return cpu, gpu


def _close(cpu: dict, gpu: dict, tol: float) -> None:
    assert cpu["status"] == gpu["status"] == "completed"
    assert cpu["samples"] == gpu["samples"]
    for key in ("auc", "logloss"):
        assert abs(cpu["eval"][key] - gpu["eval"][key]) < tol, (key, cpu["eval"], gpu["eval"])


def test_gpu_sync_worker_equals_the_cpu_run(ray_cluster, data, tmp_path):
    cpu, gpu = _pair(data, tmp_path, 'mode="sync"', "cluster.workers=1", "cluster.ps_shards=2",
                     "train.epochs=2", gpus=1)
    _close(cpu, gpu, 1e-3)


def test_gpu_async_workers_share_a_gpu_and_train_as_on_cpu(ray_cluster, data, tmp_path):
    cpu, gpu = _pair(data, tmp_path, 'mode="gba"', "cluster.workers=2", "cluster.ps_shards=2",
                     "train.epochs=2", gpus=0.5)
    _close(cpu, gpu, 0.02)  # two workers' interleaving differs from run to run


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_gpu_sync_all_reduce_on_nccl_equals_the_cpu_run(ray_cluster, data, tmp_path):
    cpu, gpu = _pair(data, tmp_path, 'mode="sync"', "cluster.workers=2", "cluster.ps_shards=2",
                     "train.epochs=2", gpus=1)
    _close(cpu, gpu, 1e-3)


def test_gpu_worker_in_bfloat16_trains_as_the_float32_cpu_run(ray_cluster, data, tmp_path):
    """A GPU's bfloat16 autocast (what "auto" picks there) changes rounding, not the model."""
    base = ('mode="sync"', "cluster.workers=1", "cluster.ps_shards=2", "train.epochs=2")
    cpu = run(config(data, *base, 'train.dense_precision="float32"'), tmp_path / "cpu")
    gpu = run(config(data, *base, 'train.dense_precision="bfloat16"', "cluster.worker_gpus=1"),
              tmp_path / "gpu")
    _close(cpu, gpu, 0.02)
