"""ZeRO from the config: stage 1 with ZeroRedundancyOptimizer, stages 2 and 3 with FSDP2.

* ``zero=dict(stage=1)``: the optimizer state is sharded across the data-parallel ranks by
  :class:`~torch.distributed.optim.ZeroRedundancyOptimizer`, built from the user's optimizer
  class, defaults and param groups; DDP still all-reduces full gradients.
* ``zero=dict(stage=2)`` / ``stage=3``: FSDP2's ``fully_shard`` on the mesh's ``"data"``
  dimension shards parameters, gradients and optimizer state. Stage 2 keeps the gathered
  parameters from forward to backward (``reshard_after_forward=False``: one all-gather per
  step, more memory); stage 3 frees them after forward and gathers again in backward.
  ``mixed_precision="bf16"`` computes with bf16 parameters and reduces gradients in fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember.parallel.optim import constructor_defaults, param_groups_for


def zero_optimizer(optimizer: torch.optim.Optimizer, process_group: Any) -> torch.optim.Optimizer:
    """A ZeroRedundancyOptimizer of the user's optimizer class over the same parameters and groups.

    Args:
        optimizer: the user's optimizer (not stepped yet).
        process_group: the data-parallel group the state is sharded over.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(
        param_groups_for(optimizer, lambda p: p),
        optimizer_class=type(optimizer),
        process_group=process_group,
        **constructor_defaults(optimizer),
    )


def fully_shard_model(
    model: nn.Module, mesh: Any, stage: int, mixed_precision: str | None, cpu_offload: bool, device: torch.device
) -> None:
    """Apply FSDP2 to ``model`` in place: each block of every ``nn.ModuleList``, then the root.

    One ``fully_shard`` group per block (a transformer layer, typically) lets a block's
    all-gather overlap the previous block's compute and bounds the memory of gathered
    parameters; the root call takes every parameter left over.

    Args:
        model: the model (already tensor-parallel when that is on).
        mesh: the 1-D data-parallel mesh (``mesh["data"]``).
        stage: 2 (keep parameters gathered between forward and backward) or 3 (reshard).
        mixed_precision: None, ``"bf16"`` or ``"fp16"``: the dtype FSDP computes in.
        cpu_offload: keep sharded parameters and optimizer state on the CPU (CUDA only; on a
            CPU device they are there already).
        device: this rank's device.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": stage == 3}
    if mixed_precision is not None:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    options["offload_policy"] = CPUOffloadPolicy() if cpu_offload and device.type == "cuda" else OffloadPolicy()
    for blocks in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        for block in blocks:
            if any(True for _ in block.parameters()):
                fully_shard(block, **options)
    fully_shard(model, **options)


@torch.no_grad()
def broadcast_module(model: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (before sharding: launch seeds
    each rank differently, and unlike DDP, FSDP2 and ``parallelize_module`` on a 2-D mesh do
    not make the starting weights equal)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=src)
