"""launch and the global context, in one process."""

from __future__ import annotations

import random

import pytest
import torch

import ember
from ember.errors import ContextError, LaunchError


def test_context_before_launch_is_a_clear_error() -> None:
    with pytest.raises(ContextError, match="before launch"):
        _ = ember.context.rank
    with pytest.raises(ContextError, match="before launch"):
        _ = ember.config.BATCH_SIZE


def test_launch_sets_context_config_and_seeds() -> None:
    ember.launch(config={"BATCH_SIZE": 8, "seed": 5}, verbose=False)
    assert ember.context.rank == 0 and ember.context.world_size == 1
    assert ember.context.is_main_process and not ember.context.is_distributed
    assert ember.context.device == torch.device("cpu")
    assert ember.config.BATCH_SIZE == 8
    a = (random.random(), torch.rand(1).item())
    ember.context.reset()
    ember.launch(config={"seed": 5}, verbose=False)
    assert (random.random(), torch.rand(1).item()) == a


def test_launching_twice_is_a_clear_error() -> None:
    ember.launch(verbose=False)
    with pytest.raises(ContextError, match="launched twice"):
        ember.launch(verbose=False)


def test_launch_overrides_apply_on_top_of_the_config() -> None:
    ember.launch(config={"gradient_accumulation": 2}, overrides=["gradient_accumulation=4", "amp=bf16"], verbose=False)
    assert ember.config.gradient_accumulation == 4 and ember.config.amp == "bf16"


def test_launch_from_slurm_and_openmpi_read_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NPROCS", "1")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    ember.launch_from_slurm(None, host="127.0.0.1", port=29512, verbose=False)
    assert ember.context.world_size == 1
    ember.context.reset()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    ember.launch_from_openmpi(None, host="127.0.0.1", port=29513, verbose=False)
    assert ember.context.rank == 0


def test_launch_from_torch_without_torchrun_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(LaunchError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set"):
        ember.launch_from_torch()


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads /proc (Linux)")
def test_exit_settling_waits_while_a_native_thread_is_busy_and_not_otherwise() -> None:
    """The atexit settle loop (see ember._exit) waits for busy threads."""
    import threading
    import time

    from ember._exit import settle_native_threads

    start = time.perf_counter()
    settle_native_threads(2.0)
    idle_s = time.perf_counter() - start
    stop = threading.Event()

    def busy() -> None:  # matmuls run without the GIL: the thread stays runnable in C++
        a = torch.randn(1500, 1500)  # ~0.1 s a product: the GIL is taken only between them
        while not stop.is_set():
            a @ a

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        settle_native_threads(0.5)
        busy_s = time.perf_counter() - start
    finally:
        stop.set()
        worker.join()
    assert idle_s < 0.5  # two quiet checks: a few ms (bounded by other threads of this process)
    assert busy_s >= 0.45  # never quiet while the other thread computes: waited to the limit
