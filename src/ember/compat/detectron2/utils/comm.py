"""detectron2's ``utils.comm``: the process's place in the job and small collectives, on ember's.

Every function works with one process (nothing to exchange) and under ``torchrun``/``ember run``
(ember's process group, joined by the first ``SimpleTrainer`` or by ``engine.launch``). The
collectives of Python objects go through ``torch.distributed``'s object collectives.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ember import distributed
from ember.context import get_context
from ember.errors import TrainerError

__all__ = [
    "all_gather",
    "gather",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "is_main_process",
    "reduce_dict",
    "shared_random_seed",
    "synchronize",
]


def get_world_size() -> int:
    """The processes of the job (1 without a process group)."""
    return distributed.world_size()


def get_rank() -> int:
    """This process's rank in the job (0 without a process group)."""
    return distributed.rank()


def get_local_rank() -> int:
    """This process's rank on its machine."""
    return get_context(default=True).local_rank if distributed.is_active() else 0


def get_local_size() -> int:
    """The processes on this machine (``$LOCAL_WORLD_SIZE``, set by torchrun; 1 alone)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if distributed.is_active() else 1


def is_main_process() -> bool:
    """Whether this is rank 0."""
    return get_rank() == 0


def synchronize() -> None:
    """A barrier across every process (nothing with one)."""
    distributed.barrier()


def all_gather(data: Any, group: Any = None) -> list[Any]:
    """Every process's ``data`` (any picklable object), in rank order; a collective.

    Example:
        >>> counts = all_gather(len(my_predictions))   # [n0, n1, ...]
    """
    if not distributed.is_active():
        return [data]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, data, group=group)
    return out


def gather(data: Any, dst: int = 0, group: Any = None) -> list[Any]:
    """Every process's ``data`` on rank ``dst`` (in rank order); ``[]`` on the others; a collective."""
    if not distributed.is_active():
        return [data]
    out: list[Any] | None = [None] * dist.get_world_size(group) if get_rank() == dst else None
    dist.gather_object(data, out, dst=dst, group=group)
    return out if out is not None else []


def reduce_dict(input_dict: dict[str, torch.Tensor], average: bool = True) -> dict[str, torch.Tensor]:
    """``input_dict``'s scalar tensors summed (or averaged) over every process, on rank 0 (the
    other ranks get their partial sums back, as detectron2's); a collective.

    Raises:
        TrainerError: a value that is not a one-element tensor.
    """
    names = sorted(input_dict)
    bad = [n for n in names if not isinstance(input_dict[n], torch.Tensor) or input_dict[n].numel() != 1]
    if bad:
        raise TrainerError(f"reduce_dict takes one-element tensors, got other values for {bad}")
    if not distributed.is_active() or not input_dict:
        return input_dict
    values = torch.stack([input_dict[n].detach().reshape(()) for n in names])
    device = values.device
    values = values.to(distributed.collective_device())
    dist.reduce(values, dst=0)
    if get_rank() == 0 and average:
        values /= get_world_size()
    return dict(zip(names, values.to(device).unbind(), strict=True))


def shared_random_seed() -> int:
    """A random seed drawn on rank 0 and shared by every process (e.g. for one shuffle); a collective."""
    seed = int(np.random.randint(2**31))
    return int(distributed.broadcast_object(seed))
