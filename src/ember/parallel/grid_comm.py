"""Collectives along one axis of a tensor grid, on plain tensors (no autograd).

The grid layers' only doors to ``torch.distributed``: every function takes the process group
of an axis, or None for an axis of one rank (then nothing is communicated). Tensors are made
contiguous here, and a dimension other than the first is moved to the front for the
``*_into_tensor`` collectives, which concatenate along dimension 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ember.errors import DataError

Group = Any
"""A ``torch.distributed`` process group, or None."""


def size(group: Group) -> int:
    """The ranks in ``group`` (1 for None)."""
    return 1 if group is None else dist.get_world_size(group)


def index(group: Group) -> int:
    """This rank's index in ``group`` (0 for None)."""
    return 0 if group is None else dist.get_rank(group)


def all_gather(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim``, in group order."""
    n = size(group)
    if n == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = torch.empty((n * front.shape[0], *front.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, dim)


def reduce_scatter(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """The sum of every rank's ``x``, cut along ``dim`` into group-size chunks: this rank's chunk."""
    n = size(group)
    if n == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = torch.empty((front.shape[0] // n, *front.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, front, group=group)
    return out.movedim(0, dim)


def all_reduce(x: torch.Tensor, group: Group, op: str = "sum") -> torch.Tensor:
    """A new tensor: ``x`` reduced (``"sum"`` or ``"max"``) over ``group``."""
    if size(group) == 1:
        return x
    out = x.contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)
    return out


def chunk(x: torch.Tensor, dim: int, group: Group, what: str = "tensor") -> torch.Tensor:
    """This rank's chunk of ``x`` along ``dim`` (no communication).

    Raises:
        DataError: ``x.shape[dim]`` does not divide by the group's size (``what`` names it).
    """
    n = size(group)
    if n == 1:
        return x
    if x.shape[dim] % n:
        raise DataError(
            f"a {what} of {x.shape[dim]} along dimension {dim} cannot be split over the {n} ranks of a tensor-parallel "
            f"axis: use a size divisible by {n} (the batch of each data-parallel rank, and each micro-batch)"
        )
    return x.chunk(n, dim=dim)[index(group)].contiguous()


def broadcast(x: torch.Tensor, src: int, group: Group) -> torch.Tensor:
    """The ``x`` of the rank at index ``src`` of ``group``, on every rank (a new tensor)."""
    if size(group) == 1:
        return x
    buf = x.contiguous().clone() if index(group) == src else torch.empty_like(x, memory_format=torch.contiguous_format)
    dist.broadcast(buf, src=dist.get_global_rank(group, src), group=group)
    return buf


def reduce_to(x: torch.Tensor, dst: int, group: Group) -> torch.Tensor | None:
    """The sum of every rank's ``x`` on the rank at index ``dst`` of ``group`` (None elsewhere)."""
    if size(group) == 1:
        return x
    buf = x.contiguous().clone()
    dist.reduce(buf, dst=dist.get_global_rank(group, dst), group=group)
    return buf if index(group) == dst else None
