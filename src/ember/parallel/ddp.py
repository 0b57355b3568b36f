"""Data parallelism with :class:`torch.nn.parallel.DistributedDataParallel`.

With ``deterministic=True`` on more than two CPU ranks, DDP's gradients are averaged by
:func:`ordered_mean` instead of its all-reduce. A ring all-reduce adds each element's rank
contributions in an order set by where the element sits in its bucket, and DDP lays its buckets
out twice — all parameters in registration order for the first backward of a new DDP, then in
the order their gradients became ready — so a run resumed from a checkpoint (a new DDP) rounds
its first update differently from the uninterrupted run, and its parameters drift by ~1e-8.
With two ranks the order cannot matter (``a + b == b + a``); with more, an all-gather summed in
rank order makes every element's sum independent of the layout, for (W - 1) · bytes sent per rank
instead of the ring's 2 (W - 1) / W.
"""

# No ``from __future__ import annotations`` here: DDP checks a communication hook's annotations
# against the real ``dist.GradBucket`` and ``Future[Tensor]`` classes, not their names as text.
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wrap_data_parallel(
    module: nn.Module,
    device: torch.device,
    options: Mapping[str, Any],
    process_group: Any = None,
    deterministic: bool = False,
) -> DistributedDataParallel:
    """Wrap ``module`` (already on ``device``, compiled if wanted) in DDP.

    Args:
        module: the module to replicate; compile it *before* wrapping (the other order runs eager).
        device: this rank's device.
        options: DDP keyword arguments from the config's ``ddp`` section.
        process_group: the data-parallel group (the mesh's ``"data"`` dim); None for the world.
        deterministic: the config's ``deterministic``: on the CPU with more than two ranks,
            average the gradients with :func:`ordered_mean` (see the module).
    """
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(module, device_ids=device_ids, process_group=process_group, **dict(options))
    if deterministic and device.type == "cpu" and dist.get_world_size(process_group) > 2:
        ddp.register_comm_hook(process_group, ordered_mean)
    return ddp


def ordered_mean(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the mean of the ranks' buckets, summed in rank order on every rank.

    Each element's result then depends only on the ranks' values, not on where DDP put it.
    """
    flat = bucket.buffer()
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    gathered = dist.all_gather(parts, flat, group=group, async_op=True)
    assert gathered is not None  # async_op=True returns a Work

    def mean(_: torch.futures.Future[Any]) -> torch.Tensor:
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return flat.copy_(total.div_(len(parts)))

    return gathered.get_future().then(mean)
