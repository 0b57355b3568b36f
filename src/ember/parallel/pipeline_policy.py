"""The Engine's policy under pipeline parallelism: gradients, clipping and state across stages.

One :class:`PipelinePolicy` serves every layout ember runs a pipeline in: stages alone, stages
with data replicas (gradients averaged over the ``"data"`` dim), stages whose layers are
tensor-parallel (DTensor parameters on the ``"tensor"`` dim) and stages whose optimizer is a
:class:`~torch.distributed.optim.ZeroRedundancyOptimizer` over the ``"data"`` dim (ZeRO-1).

=======================  ====================================================================
operation                what crosses which dim
=======================  ====================================================================
gradient sync            all-reduce (mean) of each gradient's local part over ``"data"``
``clip_grad_norm_``      the norm over the tensor shards (``full_tensor()`` of each mesh's
                         norm), then the squared norms summed over ``"pipeline"``
``state_dicts``          DTensors made whole over ``"tensor"``, ZeRO-1 state consolidated over
                         ``"data"``, then every stage gathered over ``"pipeline"`` onto rank 0
``load``                 the full state broadcast from rank 0 when only it has it; each stage
                         keeps its keys, re-sharded into its DTensor placements
=======================  ====================================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import distributed
from ember.errors import EngineError
from ember.parallel.grid import local_shards, param_specs, shard_specs
from ember.parallel.grid_policy import agree_on_overflow, grid_norm_squared, whole_optimizer_state
from ember.parallel.policy import ParallelPolicy, _containers, global_grad_norm, local_part, map_tensors

__all__ = ["PipelinePolicy"]


class PipelinePolicy(ParallelPolicy):
    """Clipping and state over all stages of the pipeline (and the data replicas of each stage).

    ``clip_grad_norm_`` reduces the norm over tensor-parallel shards and every stage.
    ``state_dicts`` gathers every stage's model and optimizer state, whole, onto global rank 0
    in the one-process format (other ranks get ``{}``); ``load`` takes that full state on
    every rank, or on rank 0 only (broadcast), and gives each stage its part.

    Args:
        group: the pipeline process group of this rank.
        positions: for each parameter of this stage's optimizer, its index in the user's optimizer.
        description: what was built, for the log.
        data_group: the data-parallel group of this stage's replicas, or None.
        zero: whether the optimizer is a ZeroRedundancyOptimizer (ZeRO-1) over the data group.
        tensor_group: the stage's 2-D/2.5-D/3-D grid (its tensor group) when its layers are grid
            layers, else None: norms count each block once over it, optimizer state is
            gathered and cut like the parameters.
        agree_overflow: with ``amp="fp16"``, make every rank agree on an overflow
            (:func:`~ember.parallel.grid_policy.agree_on_overflow`): one loss scale for all stages.

    Example:
        >>> policy = PipelinePolicy(mesh["pipeline"].get_group(), positions, "pipeline ×2", None)
    """

    keeps_partial_grads = False
    sharded_state = False

    def __init__(
        self, group: dist.ProcessGroup, positions: list[int], description: str,
        data_group: dist.ProcessGroup | None = None, zero: bool = False, tensor_group: Any = None,
        agree_overflow: bool = False, grid: bool = False,
    ) -> None:  # fmt: skip
        self.group = group
        self.positions = positions
        self.name = description
        self.data_group = data_group
        self.zero = zero
        self.grid, self.tensor_group, self.agree_overflow = grid, tensor_group, agree_overflow
        self.module: nn.Module | None = None
        """The stage whose gradients are averaged over ``data_group`` (set by the builder)."""

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        """After the boundary micro-step's backward, average the gradients over the data replicas."""
        yield
        if enabled and self.data_group is not None and self.module is not None:
            size = dist.get_world_size(self.data_group)
            for p in self.module.parameters():
                if p.grad is not None:
                    # A DTensor gradient's local shard: its data replicas hold the same shard.
                    local = local_part(p.grad)
                    dist.all_reduce(local, group=self.data_group)
                    local.div_(size)
        if enabled and self.agree_overflow and self.module is not None:
            agree_on_overflow(self.module.parameters())

    @torch.no_grad()
    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        grads = [p.grad for p in params if p.grad is not None]
        if self.grid and self.module is not None:  # grid blocks, each counted once over the tensor group
            stage_norm = grid_norm_squared(params, param_specs(self.module), self.tensor_group).sqrt()
        else:
            stage_norm = global_grad_norm(grads)  # over this stage's tensor shards: equal on its TP ranks
        squared = stage_norm.float().pow(2).reshape(1).to(distributed.collective_device())
        dist.all_reduce(squared, group=self.group)
        total = squared.sqrt()[0].to(stage_norm.device)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for grad in grads:  # each rank scales its local shard by the same factor
            local = local_part(grad)
            local.mul_(coef.to(local.device, local.dtype))
        return total

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        # Every rank takes part in making DTensors whole (over "tensor") and in ZeRO-1's
        # consolidation (over "data"); only the pipeline group of rank 0 then gathers.
        model_state = {k: _whole(v) for k, v in model.state_dict().items()}
        if self.zero:
            optimizer.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
            first_replica = dist.get_rank(optimizer.process_group) == 0  # type: ignore[attr-defined]
            ours = optimizer.state_dict() if first_replica else None
        else:
            ours = optimizer.state_dict()
        if self.grid and ours is not None:
            ours = whole_optimizer_state(ours, optimizer, param_specs(model))
        ours = _whole(ours)
        if 0 not in dist.get_process_group_ranks(self.group):
            return {}, {}
        if ours is None:  # unreachable: rank 0's pipeline group holds the first replica of each stage
            raise EngineError("a pipeline stage of rank 0's replica has no consolidated optimizer state")
        indexed = {
            "state": {self.positions[int(i)]: v for i, v in ours["state"].items()},
            "param_groups": [{**g, "params": [self.positions[i] for i in g["params"]]} for g in ours["param_groups"]],
        }
        gathered: list[Any] | None = [None] * dist.get_world_size(self.group) if dist.get_rank() == 0 else None
        dist.gather_object((model_state, indexed), gathered, dst=0, group=self.group)
        if gathered is None:
            return {}, {}
        merged_model: dict[str, Any] = {}
        for stage_model, _ in gathered:
            merged_model.update(stage_model)
        return merged_model, _merge_optimizer([opt for _, opt in gathered])

    def load_full(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        if distributed.any_true(not state["model"]):
            state = distributed.broadcast_object(state, src=0)
        with local_shards():  # keys and DTensor references, without gathering grid layers' shards
            own = model.state_dict()
        gridded = shard_specs(model)  # their whole tensors are cut by the layers themselves
        part = {k: v if k in gridded else _like(v, own[k]) for k, v in state["model"].items() if k in own}
        missing = sorted(set(own) - set(part))
        if strict and missing:
            raise EngineError(f"the model state has no entries for {missing[:5]} of this pipeline stage")
        model.load_state_dict(part, strict=strict)
        local = {g: i for i, g in enumerate(self.positions)}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        full = state["optimizer"]
        entries = {local[int(k)]: v for k, v in full["state"].items() if int(k) in local}
        if self.grid:  # a grid parameter's whole state cut to this rank's block (new dicts: the caller's stay whole)
            specs = param_specs(model)
            entries = {i: _cut(entry, specs.get(id(params[i]))) for i, entry in entries.items()}
        optimizer.load_state_dict(
            {
                # Copies of the containers: ZeroRedundancyOptimizer overwrites other ranks' entries.
                "state": {i: {n: _like(v, params[i]) for n, v in entry.items()} for i, entry in entries.items()},
                "param_groups": [
                    {**_containers(g), "params": [local[i] for i in g["params"] if i in local]}
                    for g in full["param_groups"]
                ],
            }
        )
        return state


def _cut(entry: dict[str, Any], spec: Any) -> dict[str, Any]:
    """One parameter's optimizer state with its whole tensors cut to the grid block ``spec`` says."""
    if spec is None or spec.is_whole:
        return entry
    return {
        n: spec.shard(v).clone() if isinstance(v, torch.Tensor) and v.shape == spec.shape else v
        for n, v in entry.items()
    }


def _whole(value: Any) -> Any:
    """``value`` with every tensor whole (a DTensor's ``full_tensor()``, a collective), detached, on CPU."""
    from torch.distributed.tensor import DTensor

    return map_tensors(value, lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu())


def _like(value: Any, reference: torch.Tensor) -> Any:
    """A whole tensor of ``reference``'s shape as this rank's shard of it when ``reference`` is a
    DTensor (each rank holds the whole value: no communication); anything else unchanged."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not (isinstance(reference, DTensor) and isinstance(value, torch.Tensor) and value.shape == reference.shape):
        return value
    moved = value.to(reference.device)
    return distribute_tensor(moved, reference.device_mesh, reference.placements, src_data_rank=None)


def _merge_optimizer(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """One optimizer state dict from the stages' (already in global positions)."""
    state: dict[int, Any] = {}
    for s in stages:
        state.update(s["state"])
    groups = []
    for parts in zip(*(s["param_groups"] for s in stages), strict=True):
        groups.append({**parts[0], "params": sorted(i for g in parts for i in g["params"])})
    return {"state": dict(sorted(state.items())), "param_groups": groups}
