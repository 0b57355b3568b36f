"""The collectives of the grid layers as autograd Functions, each with its conjugate backward.

The layers keep activations sharded between layers and say, op by op, how a gradient crosses
the grid. Every Function takes the process group of one axis (None: one rank, a no-op):

=========================  ===============================  =====================================
function                   forward                          backward
=========================  ===============================  =====================================
:func:`gather`             all-gather along ``dim``         reduce-scatter along ``dim`` (each
                                                            rank used the whole its own way)
:func:`reduce_scatter`     reduce-scatter along ``dim``     all-gather along ``dim``
:func:`split`              keep this rank's chunk           all-gather along ``dim``
:func:`unsplit`            all-gather along ``dim``; every  keep this rank's chunk
                           rank uses the whole the same way
:func:`reduce`             all-reduce (sum); every rank     identity: each rank's gradient of the
                           then computes the same thing     sum is already the whole one
:func:`grad_sum`           identity (a replicated tensor    all-reduce (sum) of the gradients:
                           used differently per rank)       each rank saw part of the data
=========================  ===============================  =====================================

A backward that multiplies runs under the autocast state its forward ran under (the role of
``torch.amp.custom_bwd``), see :func:`amp_state`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ember.parallel import grid_comm

__all__ = ["amp_state", "autocast_as", "gather", "grad_sum", "reduce", "reduce_scatter", "split", "unsplit"]

Group = Any
"""A ``torch.distributed`` process group, or None for an axis of one rank."""


def amp_state(device_type: str) -> tuple[str, bool, torch.dtype]:
    """The autocast state now (device type, enabled, dtype), to re-enter in a backward."""
    return device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


@contextlib.contextmanager
def autocast_as(state: tuple[str, bool, torch.dtype]) -> Iterator[None]:
    """Run under the autocast state :func:`amp_state` recorded."""
    device_type, enabled, dtype = state
    with torch.autocast(device_type, dtype=dtype, enabled=enabled):
        yield


class _Conjugate(torch.autograd.Function):
    """A collective along ``dim`` over ``group`` forward, its conjugate backward (both from grid_comm)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Group, ops: tuple[Any, Any], what: str) -> torch.Tensor:
        ctx.dim, ctx.group, ctx.backward_op = dim, group, ops[1]
        return ops[0](x, dim, group, what)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return ctx.backward_op(grad, ctx.dim, ctx.group, "gradient"), None, None, None, None


def _all_gather(x: torch.Tensor, dim: int, group: Group, what: str) -> torch.Tensor:
    return grid_comm.all_gather(x, dim, group)


def _reduce_scatter(x: torch.Tensor, dim: int, group: Group, what: str) -> torch.Tensor:
    return grid_comm.reduce_scatter(x, dim, group)


_GATHER = (_all_gather, _reduce_scatter)
_REDUCE_SCATTER = (_reduce_scatter, _all_gather)
_SPLIT = (grid_comm.chunk, _all_gather)
_UNSPLIT = (_all_gather, grid_comm.chunk)


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        return grid_comm.all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad, None


class _GradSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grid_comm.all_reduce(grad, ctx.group), None


def gather(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """All-gather ``x`` along ``dim`` over ``group``; the backward reduce-scatters the gradient.

    For a tensor each rank then uses its own way (3-D: the input gathered over the input axis
    meets a different weight block on each rank), so the gradients are partial sums.
    """
    return x if group is None else _Conjugate.apply(x, dim, group, _GATHER, "tensor")


def reduce_scatter(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's chunk along ``dim``; the backward all-gathers."""
    return x if group is None else _Conjugate.apply(x, dim, group, _REDUCE_SCATTER, "tensor")


def split(x: torch.Tensor, dim: int, group: Group, what: str = "tensor") -> torch.Tensor:
    """This rank's chunk of ``x`` (the same on every rank of ``group``) along ``dim``; the
    backward all-gathers the chunks' gradients into the whole one.

    Raises:
        DataError: the size along ``dim`` does not divide by the group's (``what`` names it).
    """
    if group is None:
        return x
    if not (x.is_floating_point() or x.is_complex()):  # ids, labels: nothing to differentiate
        return grid_comm.chunk(x, dim, group, what)
    return _Conjugate.apply(x, dim, group, _SPLIT, what)


def unsplit(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """The inverse of :func:`split`: all-gather ``x`` along ``dim`` for a whole tensor every rank
    then uses the same way (a model's output before a plain loss); the backward keeps this
    rank's chunk of the gradient."""
    return x if group is None else _Conjugate.apply(x, dim, group, _UNSPLIT, "tensor")


def reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    """All-reduce (sum) ``x`` over ``group``, for a result every rank then uses the same way
    (a classifier's logits, a loss): the backward passes the gradient through."""
    return x if group is None else _Reduce.apply(x, group)


def grad_sum(x: torch.Tensor, group: Group) -> torch.Tensor:
    """``x`` itself, replicated over ``group`` and used on each rank with its own data: the
    backward sums the ranks' gradients (a LayerNorm weight under 2-D, the bias of a 3-D Linear)."""
    return x if group is None else _GradSum.apply(x, group)
