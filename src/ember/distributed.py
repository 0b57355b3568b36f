"""Small collective helpers that are plain no-ops when the world has one process.

They keep single- and multi-process code paths the same: callers never test the world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def is_active() -> bool:
    """True when a process group with more than one process is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """Number of processes in the default group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """Global rank of this process (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce(tensor: torch.Tensor, op: Literal["sum", "max", "min"] = "sum") -> torch.Tensor:
    """Reduce ``tensor`` in place across ranks and return it.

    Example:
        >>> total = all_reduce(torch.tensor([correct, seen], dtype=torch.float64))
    """
    if is_active():
        dist.all_reduce(tensor, op=_OPS[op])
    return tensor


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order, on every rank.

    Each rank's tensor must have the same shape (a 0-dim tensor counts as one element). With
    one process: ``tensor`` itself, made at least one-dimensional.

    Example:
        >>> all_gather(torch.tensor([loss]))     # tensor([loss_rank0, loss_rank1])
    """
    local = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach()
    if not is_active():
        return local
    device = collective_device()
    parts = [torch.empty_like(local, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.to(device).contiguous())
    return torch.cat(parts).to(tensor.device)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Return rank ``src``'s ``obj`` on every rank (picklable objects only)."""
    if not is_active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    """Wait until every rank reaches this point."""
    if is_active():
        dist.barrier()


def collective_device() -> torch.device:
    """The device tensors must live on for the default group's collectives (CUDA for NCCL)."""
    if is_active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_true(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on at least one rank.

    Every rank must call it at the same point: it is a collective.
    """
    if not is_active():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class PendingFlag:
    """The answer of an :func:`any_true_async`, read later with :meth:`result`."""

    def __init__(self, flag: bool) -> None:
        self._tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=collective_device())
        self._work = dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, async_op=True) if is_active() else None

    def result(self) -> bool:
        """True on every rank when at least one rank's flag was True (waits for the exchange)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        return bool(self._tensor.item())


def max_async(values: Sequence[float]) -> PendingMax:
    """Start an element-wise MAX all-reduce of ``values`` without waiting for it: the exchange
    overlaps the work that follows.

    Every rank must call it at the same point (it is a collective) and read the result later.
    """
    return PendingMax(values)


class PendingMax:
    """The answer of a :func:`max_async`, read later with :meth:`result`."""

    def __init__(self, values: Sequence[float]) -> None:
        self._tensor = torch.tensor(values, dtype=torch.float64, device=collective_device())
        self._work = dist.all_reduce(self._tensor, op=dist.ReduceOp.MAX, async_op=True) if is_active() else None

    def result(self) -> list[float]:
        """Every rank's element-wise maximum (waits for the exchange)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        return [float(v) for v in self._tensor.tolist()]
