"""Context parallelism and activation offload on CUDA (``pytest -m cuda tests/cuda``; not in ``make test``).

On CUDA, context parallelism is torch's own (``torch.distributed.tensor.experimental.context_parallel``,
whose ring runs the flash / memory-efficient / cuDNN SDPA kernels: torch 2.13 has no CPU ring),
and ember does not wire it into the Engine yet: ``parallel.context`` on CUDA is a ConfigError
naming it. These tests pin what a session with GPUs needs to wire it: that torch's ring on 2
GPUs (NCCL) equals one-GPU SDPA for the zig-zag (head-tail) slices ember's loaders cut, causal,
forward and every gradient; and that ember's activation offload keeps the saved inputs in host
memory with unchanged gradients (one GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ember.errors import ConfigError
from ember.layout import ParallelLayout
from ember.parallel.checkpointing import checkpoint
from ember.parallel.context_policy import check_context
from tests.cuda.test_cuda import _need_cuda  # noqa: F401 (autouse: these tests need a GPU too)
from tests.dist import free_port

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parents[2]


def test_context_parallelism_on_cuda_is_refused_naming_torchs_context_parallel() -> None:
    with pytest.raises(ConfigError, match=r"ember does not wire into the Engine yet"):
        check_context(ParallelLayout(data=1, context=2), 0, False, device=torch.device("cuda", 0))


def test_offloaded_checkpoint_keeps_inputs_on_the_host_and_gradients_unchanged() -> None:
    block = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()
    x = torch.randn(4096, 64, device="cuda", requires_grad=True)

    def step(offload: bool) -> tuple[int, list[torch.Tensor]]:
        block.zero_grad(set_to_none=True)
        x.grad = None
        h = x * 2  # an activation only the checkpoint could keep alive
        y = checkpoint(block, h, offload=offload)
        del h
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        y.sum().backward()
        return held, [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]

    kept, expected = step(offload=False)
    offloaded, got = step(offload=True)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert kept - offloaded >= 4096 * 64 * 4  # the 1 MiB input waits in host memory instead


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="torch's context parallelism needs 2 GPUs (NCCL)")
def test_torchs_ring_on_two_gpus_equals_one_gpu_sdpa_on_embers_zigzag_slices() -> None:
    script = Path(__file__).parent / "scripts" / "torch_context_parallel.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(script)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "MAX_DIFF" in run.stdout
    worst = max(float(line.split()[-1]) for line in run.stdout.splitlines() if line.startswith("MAX_DIFF"))
    assert worst <= 2e-3  # bf16 flash attention on both sides
