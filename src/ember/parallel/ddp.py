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


def rewrap_data_parallel(ddp: DistributedDataParallel) -> DistributedDataParallel:
    """A new DDP over ``ddp.module`` for its current trainable parameters, with ``ddp``'s settings
    and communication hooks; ``ddp``'s reducer stops listening to the parameters.

    Not a collective (``init_sync=False``: the replicas are already equal), but every rank must
    rebuild at the same micro-step, as every rank runs the same program.
    """
    cap = None if ddp.bucket_bytes_cap_default else ddp.bucket_bytes_cap / 2**20
    # torch 2.13 renamed broadcast_buffers (and warns on the old name); earlier versions know only it
    buffers: dict[str, Any] = (
        {"forward_sync_buffers": ddp.forward_sync_buffers}
        if hasattr(ddp, "forward_sync_buffers")
        else {"broadcast_buffers": ddp.broadcast_buffers}
    )
    new = DistributedDataParallel(
        ddp.module,
        device_ids=ddp.device_ids,
        output_device=ddp.output_device,
        dim=ddp.dim,
        init_sync=False,
        process_group=ddp.process_group,
        bucket_cap_mb=cap,
        find_unused_parameters=ddp.find_unused_parameters,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        static_graph=ddp.static_graph,
        mixed_precision=ddp.mixed_precision,
        **buffers,
    )
    for hook, state in ddp._comm_hooks:  # ordered_mean, or the user's: DDP keeps the list of what was registered
        new.register_comm_hook(state, hook)
    new.train(ddp.training)
    ddp._remove_autograd_hooks()  # a reference kept elsewhere must not hear these parameters' gradients
    return new


def reduced_parameters(ddp: DistributedDataParallel) -> list[tuple[str, nn.Parameter]]:
    """The named parameters whose gradients ``ddp`` averages: those that required grad when it was
    built, less the ones it was told to ignore (call it right after building ``ddp``)."""
    return [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ddp.parameters_to_ignore]


class LateParameters:
    """The parameters ``ddp`` does not reduce because they were frozen when it was built, each
    with a hook that notes it in :attr:`arrived` when it receives a gradient: it was unfrozen.

    While they stay frozen no hook runs, so watching costs nothing per step.
    """

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self.arrived: dict[int, nn.Parameter] = {}
        """The watched parameters that received a gradient, by id."""
        self._handles: list[Any] = []
        for name, p in ddp.module.named_parameters():
            if p.requires_grad or name in ddp.parameters_to_ignore or not p.is_floating_point():
                continue
            p.requires_grad_(True)  # torch registers hooks only on tensors that require grad
            try:
                self._handles.append(p.register_post_accumulate_grad_hook(self._arrive))
            finally:
                p.requires_grad_(False)

    def _arrive(self, param: torch.Tensor) -> None:
        self.arrived[id(param)] = param  # type: ignore[assignment]

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


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
