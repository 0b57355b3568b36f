"""The Engine's policy for models on a 2-D, 2.5-D or 3-D grid (:class:`GridPolicy`).

The layers compute whole gradients for their shards themselves (every sum over the grid is
in their backward), so what the Engine does differently is small:

=========================  =====================================================================
operation                  what it does
=========================  =====================================================================
gradient sync              after the boundary micro-step's backward, each gradient (a shard's)
                           averaged over ``"data"``; with ``amp="fp16"``, the ranks agree on
                           an overflow (:func:`agree_on_overflow`)
``clip_grad_norm_``        the global norm with every block counted once: each rank's sum of
                           squares divided by the ranks holding the same block, summed over
                           the tensor group (:func:`grid_norm_squared`)
``state_dicts``            whole tensors: the model's ``state_dict()`` (the layers gather their
                           shards) and the optimizer state gathered like its parameter; rank 0
                           keeps them (the one-process format), the other ranks get ``{}``
``load``                   whole tensors (from every rank, or rank 0's broadcast), each rank
                           keeping its blocks; or the sharded state of a checkpoint directory
``sharded_state_dicts``    the shards as DTensors over the grid's mesh (model and optimizer,
                           keyed by parameter name): ``torch.distributed.checkpoint`` saves
                           them and reshards them into any layout on load
=========================  =====================================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import distributed
from ember.parallel.grid import ShardSpec, local_shards, param_specs, shard_specs
from ember.parallel.policy import ShardedPolicy, _containers, all_reduce_mean, local_part, map_tensors

__all__ = ["GridPolicy", "agree_on_overflow", "grid_norm_squared"]


class GridPolicy(ShardedPolicy):
    """Data-parallel averaging, clipping and state for a model of grid layers.

    Args:
        model: the model (its grid layers' parameters are this rank's shards).
        tensor_group: the tensor-parallel group (the grid), or None with one tensor rank.
        data_group: the data-parallel group, or None.
        description: what was built, for the log.
        agree_overflow: make the ranks agree on an fp16 overflow before the scaler looks
            (``amp="fp16"``).

    Example:
        >>> policy = GridPolicy(model, ember.context.get_group("tensor"), ember.context.get_group("data"), "2d ×4")
    """

    def __init__(
        self, model: nn.Module, tensor_group: Any, data_group: Any, description: str, agree_overflow: bool = False
    ) -> None:
        super().__init__(None, description)
        self.module = model
        self.tensor_group = tensor_group
        self.data_group = data_group
        self.agree_overflow = agree_overflow

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        yield
        if enabled:
            params = list(self.module.parameters())
            if self.data_group is not None:
                all_reduce_mean([p.grad for p in params if p.grad is not None], self.data_group)
            if self.agree_overflow:
                agree_on_overflow(params)

    @torch.no_grad()
    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        squared = grid_norm_squared(params, param_specs(self.module), self.tensor_group)
        return scale_to_norm(params, squared.sqrt(), max_norm)

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        model_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        optimizer_state = whole_optimizer_state(optimizer.state_dict(), optimizer, param_specs(model))
        if distributed.rank() != 0:
            return {}, {}
        return model_state, map_tensors(optimizer_state, lambda t: t.detach().cpu())

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        if distributed.any_true(not state["model"]):
            state = distributed.broadcast_object(state, src=0)
        model.load_state_dict(state["model"], strict=strict)
        optimizer.load_state_dict(shard_optimizer_state(state["optimizer"], optimizer, param_specs(model)))
        return state

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        if not state.get("sharded"):
            return self.load_full(model, optimizer, state, strict)
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        with local_shards():
            model.load_state_dict(state["model"], strict=strict)
        set_optimizer_state_dict(model, optimizer, map_tensors(state["optimizer"], local_part))
        return state

    def sharded_state_dicts(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        specs = shard_specs(model)
        with local_shards():
            model_state = model.state_dict()
            optimizer_state: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer))
        # New dicts: torch's optimizer state dict shares each parameter's entry with the optimizer.
        optimizer_state["state"] = {
            name: _views(entry, specs.get(name)) for name, entry in optimizer_state["state"].items()
        }
        return model_state, optimizer_state


def _views(entry: dict[str, Any], spec: ShardSpec | None) -> dict[str, Any]:
    """One parameter's optimizer state with its shard-shaped tensors as DTensor views (same storage)."""
    if spec is None or spec.is_whole:
        return dict(entry)
    shape = spec.local_shape()
    return {k: spec.as_dtensor(v) if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape == shape else v
            for k, v in entry.items()}  # fmt: skip


@torch.no_grad()
def agree_on_overflow(params: Iterable[nn.Parameter]) -> bool:
    """Whether any rank has a non-finite gradient; if so, every rank gets one.

    With ``amp="fp16"`` each rank's ``GradScaler`` checks only its own shards, so one stage or
    one block overflowing would skip the update there and apply it elsewhere. This all-reduces
    (over every rank: data replicas agree already) whether any local gradient holds an inf or
    NaN and, where none does, writes an inf into one, so that every scaler skips the same
    updates and lowers its scale alike. A collective; the loop calls it at each boundary.
    """
    grads = [p.grad for p in params if p.grad is not None]
    mine = any(not bool(torch.isfinite(g).all()) for g in grads)
    anyone = distributed.any_true(mine)
    if anyone and not mine and grads:
        grads[0].view(-1)[0] = float("inf")
    return anyone


def grid_norm_squared(params: Iterable[nn.Parameter], specs: dict[int, ShardSpec], tensor_group: Any) -> torch.Tensor:
    """The squared 2-norm of all gradients, each block counted once: every rank's squares of a
    block held by ``r`` ranks count ``1/r``, summed over ``tensor_group`` (float32, on every rank).

    A parameter without a spec counts as held by every rank of the tensor group.
    """
    params = list(params)
    size = 1 if tensor_group is None else dist.get_world_size(tensor_group)
    total = None
    for p in params:
        if p.grad is None:
            continue
        spec = specs.get(id(p))
        share = (p.grad.float().pow(2).sum()) / (spec.replicas if spec is not None else size)
        total = share if total is None else total + share
    device = next((p.grad.device for p in params if p.grad is not None), torch.device("cpu"))
    squared = (total if total is not None else torch.zeros((), device=device)).reshape(1)
    if tensor_group is not None:
        dist.all_reduce(squared, group=tensor_group)
    return squared[0]


def scale_to_norm(params: Iterable[nn.Parameter], total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale every gradient by ``min(1, max_norm / total)`` in place; return ``total``."""
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef.to(p.grad.device, p.grad.dtype))
    return total


def whole_optimizer_state(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, specs: dict[int, ShardSpec]
) -> dict[str, Any]:
    """``optimizer.state_dict()`` with each parameter-shaped state tensor gathered whole like its
    parameter (a collective over the grid, every rank in the same order)."""
    return _map_param_state(state, optimizer, specs, lambda param, spec: param.shape, lambda spec, t: spec.gather(t))


def shard_optimizer_state(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, specs: dict[int, ShardSpec]
) -> dict[str, Any]:
    """The reverse of :func:`whole_optimizer_state`: each whole state tensor cut to this rank's block."""
    return _map_param_state(
        state, optimizer, specs, lambda param, spec: spec.shape, lambda spec, t: spec.shard(t).clone()
    )


def _map_param_state(
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    specs: dict[int, ShardSpec],
    shape: Callable[[torch.Tensor, ShardSpec], Any],
    convert: Callable[[ShardSpec, torch.Tensor], torch.Tensor],
) -> dict[str, Any]:
    """A copy of an optimizer state dict where each state tensor of a sharded parameter that has
    the parameter's ``shape(param, spec)`` is replaced by ``convert(spec, tensor)``, in the order
    of the parameters (the same on every rank: ``convert`` may be a collective)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = _containers(state)
    for index, entry in out.get("state", {}).items():
        param = params[int(index)]
        spec = specs.get(id(param))
        if spec is None or spec.is_whole:
            continue
        expected = shape(param, spec)
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == expected:
                entry[key] = convert(spec, value)
    return out
