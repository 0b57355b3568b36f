"""Kubernetes: ember started from exactly the variables the training operators set (no cluster).

A Kubeflow ``PyTorchJob`` pod that runs ``python train.py`` gets ``MASTER_ADDR`` (the master
pod's service), ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` (its replica index), ``PET_NNODES``,
``PET_NODE_RANK``, ``PET_NPROC_PER_NODE`` and ``PYTHONUNBUFFERED=0``, and no ``LOCAL_RANK``
(training-operator ``pkg/controller.v1/pytorch/envvar.go``). A Kubeflow ``TrainJob`` pod runs
``torchrun train.py`` with ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (trainer ``pkg/runtime/framework/plugins/torch``),
which torchrun reads as its options. Two local processes stand for two pods; the master's
service name is 127.0.0.1. Both train the job of the one-agent torchrun reference.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import ember
from ember.errors import LaunchError
from tests.dist import free_port
from tests.launch.common import JOB, assert_same_training, finish, reports, start


def pods(tmp_path: Path, command: list[str], env_of: Any) -> dict[int, dict[str, Any]]:
    """Start two "pods" running ``command`` with ``env_of(index)``; wait; return the ranks' reports."""
    procs = [start(command, tmp_path / f"pod{i}", **env_of(i)) for i in range(2)]
    outputs = [finish(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outputs)
    return reports(tmp_path / "out")


@pytest.mark.multiprocess
def test_pytorchjob_pods_running_python_train_the_torchrun_job(tmp_path: Path, reference: dict[str, Any]) -> None:
    port = str(free_port())

    def operator_env(index: int) -> dict[str, str]:  # replica Master-0 is rank 0, Worker-0 rank 1
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(index)}
        pet = {"PET_NNODES": "2", "PET_NODE_RANK": str(index), "PET_NPROC_PER_NODE": "1"}
        return {**env, **pet, "PYTHONUNBUFFERED": "0"}

    got = pods(tmp_path, [sys.executable, str(JOB), str(tmp_path / "out")], operator_env)
    assert {r["world_size"] for r in got.values()} == {2}
    assert_same_training(got, reference["reports"])


@pytest.mark.multiprocess
def test_trainjob_pods_running_torchrun_from_pet_variables_train_the_torchrun_job(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    port = str(free_port())

    def runtime_env(index: int) -> dict[str, str]:  # the Torch plugin's variables; the command is torchrun
        return {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(index),
                "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}  # fmt: skip

    torchrun = [sys.executable, "-m", "torch.distributed.run", str(JOB), str(tmp_path / "out")]
    got = pods(tmp_path, torchrun, runtime_env)
    assert {r["world_size"] for r in got.values()} == {2}
    assert_same_training(got, reference["reports"])


def test_launch_from_torch_without_local_rank_is_one_process_per_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOCAL_RANK", "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(name, value)
    ctx = ember.launch_from_torch(verbose=False)
    assert (ctx.rank, ctx.local_rank, ctx.world_size) == (0, 0, 1)


def test_launch_from_torch_without_local_rank_refuses_a_pod_meant_for_several_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    env = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    for name, value in {**env, "PET_NPROC_PER_NODE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LaunchError, match=r"LOCAL_RANK is not set, but PET_NPROC_PER_NODE='2'.*torchrun script.py"):
        ember.launch_from_torch(verbose=False)
