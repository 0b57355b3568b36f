"""From the config to a parallel model: check everything first, then build in one place.

:func:`check_parallel` runs before anything touches a process group, so bad settings fail
on every rank with one clear error instead of a hang. :func:`parallelize` then builds, per the
table in ``docs/parallel.md``:

=============================================  ================================================
config                                         what runs
=============================================  ================================================
one process                                    the model itself (``zero`` is a no-op)
world > 1                                      DDP over the ``"data"`` dim
``zero=dict(stage=1)``                         DDP + ZeroRedundancyOptimizer
``zero=dict(stage=2 | 3)``                     FSDP2 ``fully_shard`` on the ``"data"`` dim
``parallel=dict(tensor=T)``                    ``parallelize_module`` on the ``"tensor"`` dim
``tensor=T`` with data > 1, ``zero`` 2 | 3     TP, then FSDP2 on the data dim (2-D)
``parallel=dict(pipeline=P)``                  this rank's stage (``ember.parallel.pipeline``),
                                               run by the Trainer's ``PipelineSchedule``
``pipeline=P`` with ``tensor=T``               each stage tensor-parallel over ``"tensor"``
``pipeline=P`` with ``zero=dict(stage=1)``     the stage's optimizer a ZeroRedundancyOptimizer
                                               over ``"data"``
``parallel=dict(expert=E)``                    no DDP: ``ExpertParallelPolicy`` reduces the
                                               gradients (``ember.parallel.moe_policy``)
``tensor=dict(mode="2d" | "2.5d" | "3d")``     the model's grid layers (or a plain 2-D/2.5-D
                                               model's layers converted), gradients averaged
                                               over ``"data"`` (:mod:`ember.parallel.grid_plan`)
=============================================  ================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ember import context as _context
from ember.config import Config
from ember.context import Context, ParallelLayout
from ember.errors import ConfigError
from ember.parallel.ddp import wrap_data_parallel
from ember.parallel.grid import grids_of
from ember.parallel.grid_plan import check_grid_model, is_grid_mode
from ember.parallel.moe_policy import ExpertParallelPolicy, check_expert_parallel, sync_replicas
from ember.parallel.optim import (
    check_rebuildable,
    make_view,
    parameter_names,
    rebuild_optimizer,
    retarget_scheduler,
)
from ember.parallel.policy import DataParallelPolicy, ParallelPolicy, ShardedPolicy, ZeroPolicy
from ember.parallel.tensor import apply_tensor_parallel, resolve_plan
from ember.parallel.zero import broadcast_module, fully_shard_model, zero_optimizer


@dataclass
class Parallelized:
    """What :func:`parallelize` built for the Engine.

    Attributes:
        train_module: what the training forward runs through (DDP, or the sharded model).
        eval_module: what the forward runs through under ``torch.no_grad()``.
        optimizer: the optimizer that steps (the user's, a ZeroRedundancyOptimizer, or the
            user's class rebuilt over DTensor parameters).
        policy: the Engine's parallel policy.
        model: the module the Engine owns when it is not the user's model (pipeline: this
            rank's stage), else None.
        sequence: under context parallelism the
            :class:`~ember.parallel.context_parallel.SequenceSharding` that slices the loaders'
            batches and averages the criterion's loss; else None.
    """

    train_module: nn.Module
    eval_module: nn.Module
    optimizer: torch.optim.Optimizer
    policy: ParallelPolicy
    model: nn.Module | None = None
    sequence: Any = None


@dataclass(frozen=True)
class ParallelPlan:
    """The checked result of :func:`check_parallel`: the layout, the ZeRO stage, the TP plan, and
    the layer names of each pipeline stage (None without pipeline parallelism)."""

    layout: ParallelLayout
    zero_stage: int
    tensor_plan: dict[str, Any] | None
    pipeline_stages: tuple[tuple[str, ...], ...] | None = None
    grid: str | None = None
    """Under a 2-D/2.5-D/3-D mode: ``"built"`` (the model's own grid layers) or ``"convert"``
    (a plain model whose layers ember replaces); None otherwise."""


def check_parallel(cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer, world_size: int) -> ParallelPlan:
    """Check the ``parallel`` and ``zero`` settings against the model, optimizer and world.

    Raises:
        ConfigError: pipeline parallelism combined with ZeRO stage 2/3 or compile, or
            with a split the model does not allow; ZeRO-1 options or ZeRO-1 with tensor
            parallelism; a missing or bad tensor-parallel plan; sizes that do not fit the
            world; data × tensor parallelism without ``zero`` stage 2 or 3 (or pipeline); a
            2-D/2.5-D/3-D model that the grid cannot place (:func:`~ember.parallel.grid_plan.check_grid_model`).
        EngineError: an optimizer that ember cannot rebuild over sharded parameters.
    """
    stages = _check_pipeline(cfg, model, optimizer) if cfg.parallel.pipeline.size > 1 else None
    zero = cfg.zero
    stage = int(zero.stage) if zero else 0
    tensor = cfg.parallel.tensor
    if stage == 1:
        for key in ("mixed_precision", "cpu_offload"):
            if zero.get(key):
                raise ConfigError(
                    f"config zero.{key}={zero[key]!r} applies to zero stage 2 and 3 (FSDP2) only; with "
                    f"stage 1 use amp='bf16' for mixed precision, or choose stage 2 or 3"
                )
        if tensor.size > 1:
            raise ConfigError(
                f"config zero.stage=1 with parallel.tensor.size={tensor.size}: ZeRO-1 runs on DDP, which cannot "
                "hold tensor-parallel (DTensor) parameters; use zero=dict(stage=2) or stage=3 (FSDP2)"
            )
    layout = ParallelLayout.from_config(cfg.parallel, world_size)
    if layout.context > 1:  # context parallelism (ember.parallel.context_parallel)
        from ember.parallel.context_policy import check_context

        check_context(layout, stage, stages is not None, bool(cfg.compile and cfg.get("activation_checkpointing")))
    check_expert_parallel(model, layout, stage)  # and MoE layers built for this layout
    # The 2-D, 2.5-D and 3-D modes place the model on their grid.
    if is_grid_mode(layout) or grids_of(model):
        if layout.context > 1:  # the grid modes are refused by check_context; this is 1-D grid layers
            raise ConfigError(
                f"config parallel.context={layout.context} with a model built from ember.parallel.tensor1d layers: "
                "context parallelism runs with 1-D tensor parallelism from a plan (parallel.tensor.plan), not "
                "with the grid layers, in this ember version"
            )
        grid = check_grid_model(model, layout, cfg, pipeline=stages is not None)
        if grid == "convert":
            check_rebuildable(optimizer, f"parallel.tensor.mode={layout.tensor_mode!r}")
        return ParallelPlan(layout, stage, None, stages, grid)
    # Under pipeline (context) parallelism the gradients are averaged over "data" by the policy, not DDP.
    if layout.tensor > 1 and layout.data > 1 and stage < 2 and stages is None and layout.context == 1:
        raise ConfigError(
            f"config parallel.tensor.size={layout.tensor} with {layout.data} data-parallel replicas needs "
            "zero=dict(stage=2) or stage=3 (FSDP2 over the data dim of the 2-D mesh), or parallel.data=1 "
            f"with {layout.tensor} processes"
        )
    plan = resolve_plan(model, tensor.plan, tensor.size) if tensor.size > 1 else None
    if stage or plan is not None:
        check_rebuildable(optimizer, f"zero stage {stage}" if stage else "tensor parallelism")
    return ParallelPlan(layout, stage, plan, stages)


PIPELINE_COMBINATIONS = (
    "pipeline alone; × data (parallel.data); × tensor (parallel.tensor with a plan, or mode '2d'/'2.5d'/'3d' "
    "layers); × data × tensor; × data with zero=dict(stage=1); any of these with amp='fp16' or 'bf16'"
)
"""What pipeline parallelism runs with, for the error messages."""


def _check_pipeline(cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[tuple[str, ...], ...]:
    """Pipeline settings that ember cannot run, and the split into stages (see :mod:`ember.parallel.pipeline`)."""
    from ember.parallel.pipeline import split_model

    pipe = cfg.parallel.pipeline
    stage = int(cfg.zero.stage) if cfg.zero else 0
    tensor = cfg.parallel.tensor.size
    unsupported = {
        "zero": f"zero.stage={stage} (stages 2 and 3 shard parameters with FSDP2, which ember does not run inside "
        "a pipeline stage)"
        if stage > 1
        else None,
        "zero_tensor": f"zero.stage=1 together with parallel.tensor.size={tensor} (ZeRO-1 cannot hold "
        "tensor-parallel DTensor parameters)"
        if stage == 1 and tensor > 1
        else None,
        "compile": "compile=True" if cfg.compile else None,
    }
    clash = [text for text in unsupported.values() if text is not None]
    if clash:
        raise ConfigError(
            f"config parallel.pipeline.size={pipe.size} cannot be combined with {', '.join(clash)} in this ember "
            f"version. Pipeline parallelism runs as: {PIPELINE_COMBINATIONS}"
        )
    micro = pipe.microbatches or pipe.size
    if pipe.schedule == "1f1b" and micro < pipe.size:
        raise ConfigError(
            f"config parallel.pipeline.schedule='1f1b' needs microbatches >= size ({pipe.size}), got {micro}: "
            f"raise parallel.pipeline.microbatches or use schedule='gpipe'"
        )
    check_rebuildable(optimizer, "pipeline parallelism")
    return tuple(tuple(s) for s in split_model(model, pipe.size, pipe.split_points))


def parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: Config,
    ctx: Context,
    plan: ParallelPlan,
    lr_scheduler: Any = None,
) -> Parallelized:
    """Build the parallel model, optimizer and policy that :func:`check_parallel` approved.

    The model must already be on ``ctx.device``. Every rank must call this with the same
    config (it builds process groups and broadcasts weights). When the optimizer that steps is
    a new one, the user's ``optimizer`` becomes a view of it (``make_view``: its param groups
    are the new one's, so schedulers built over it keep working) and ``lr_scheduler`` is moved
    over to it.
    """
    layout = plan.layout
    if ctx.world_size == 1:
        module = _compiled(model, cfg)
        return Parallelized(module, module, optimizer, ParallelPolicy())
    if layout.context > 1:  # before any collective: every rank has the same device type
        from ember.parallel.context_policy import check_context

        check_context(layout, plan.zero_stage, plan.pipeline_stages is not None, device=ctx.device)
    mesh = _context.get_mesh(layout)
    if mesh is None:  # unreachable: world > 1 always has a mesh
        raise RuntimeError(f"no device mesh for {layout}")
    if plan.pipeline_stages is not None:
        from ember.parallel.pipeline_schedule import build_pipeline

        stages = [list(s) for s in plan.pipeline_stages]
        stage, guard, stepping, policy = build_pipeline(
            model, optimizer, cfg, ctx, mesh, stages, plan.tensor_plan, plan.zero_stage, grid=plan.grid is not None
        )
        _follow(optimizer, stepping, lr_scheduler)
        return Parallelized(guard, guard, stepping, policy, model=stage)  # the policy holds the pipeline schedule
    if layout.expert > 1:  # no DDP: the policy reduces expert and other gradients over their own groups
        sync_replicas(model, layout)
        module = _compiled(model, cfg)
        return Parallelized(module, module, optimizer, ExpertParallelPolicy(model, layout))
    if plan.grid is not None:
        return _parallelize_grid(model, optimizer, cfg, plan, lr_scheduler)
    fsdp = plan.zero_stage >= 2 and layout.data > 1
    if plan.tensor_plan is None and not fsdp and layout.context == 1:
        if cfg.ddp and cfg.ddp.get("static_graph") and cfg.gradient_accumulation > 1:
            # torch's reducer asserts (expect_autograd_hooks_) at the first step: a static graph is
            # recorded in an iteration that all-reduces, and no_sync skips that
            raise ConfigError(
                f"config ddp.static_graph=True with gradient_accumulation={cfg.gradient_accumulation}: torch's DDP "
                "cannot skip the gradient all-reduce (no_sync) of a non-boundary micro-step on a static graph; "
                "drop ddp.static_graph, or set gradient_accumulation=1"
            )
        eval_module = _compiled(model, cfg)  # compile before DDP: DDP(compile(m)) compiles, the reverse runs eager
        ddp = wrap_data_parallel(
            eval_module, ctx.device, cfg.ddp, process_group=mesh["data"].get_group(), deterministic=cfg.deterministic
        )
        if plan.zero_stage != 1:
            return Parallelized(ddp, eval_module, optimizer, DataParallelPolicy(ddp))
        stepping = zero_optimizer(optimizer, mesh["data"].get_group())
        _follow(optimizer, stepping, lr_scheduler)
        return Parallelized(ddp, eval_module, stepping, ZeroPolicy(ddp))

    broadcast_module(model)
    names = parameter_names(model)
    built = []
    if plan.tensor_plan is not None:
        apply_tensor_parallel(model, plan.tensor_plan, mesh["tensor"])
        built.append(f"tensor parallel ×{layout.tensor}")
    if fsdp:
        zero = cfg.zero
        fully_shard_model(model, mesh["data"], plan.zero_stage, zero.mixed_precision, zero.cpu_offload, ctx.device)
        built.append(f"FSDP2 zero stage {plan.zero_stage} ×{layout.data}")
    why = f"zero stage {plan.zero_stage}" if fsdp else "tensor parallelism"
    stepping = rebuild_optimizer(optimizer, model, names, why) if built else optimizer
    if stepping is not optimizer:
        _follow(optimizer, stepping, lr_scheduler)
    module = _compiled(model, cfg)
    if layout.context > 1:  # context parallelism (ember.parallel.context_parallel): its own forward and policy
        from ember.parallel.context_policy import context_parallelized

        forward, context_policy, sequence = context_parallelized(module, stepping, cfg.parallel.context, layout, built)
        return Parallelized(forward, forward, stepping, context_policy, sequence=sequence)
    return Parallelized(module, module, stepping, ShardedPolicy(model if fsdp else None, " + ".join(built)))


def _parallelize_grid(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Config, plan: ParallelPlan, lr_scheduler: Any
) -> Parallelized:
    """Issue 27: the model on its 2-D/2.5-D/3-D grid (its layers, or a plain model's converted),
    replicas made equal, gradients averaged over ``"data"`` by :class:`~ember.parallel.grid_policy.GridPolicy`."""
    from ember.parallel.grid import grid_of
    from ember.parallel.grid_plan import convert_model, sync_replicas
    from ember.parallel.grid_policy import GridPolicy

    layout = plan.layout
    grid = grid_of(layout)
    stepping = optimizer
    axes = " × ".join(f"{axis.removeprefix('tensor_')} {layout.size(axis)}" for axis in grid.axes)
    built = f"{layout.tensor_mode} tensor parallel ×{layout.tensor} ({axes})"
    if plan.grid == "convert":
        names = parameter_names(model)
        replaced = convert_model(model, grid)
        stepping = rebuild_optimizer(optimizer, model, names, f"parallel.tensor.mode={layout.tensor_mode!r}")
        _follow(optimizer, stepping, lr_scheduler)
        built += f", {len(replaced)} layers converted"
    data_group = _context.get_group("data", layout)
    sync_replicas(model, data_group)
    if layout.data > 1:
        built += f" × data {layout.data}"
    tensor_group = _context.get_group("tensor", layout)
    policy = GridPolicy(model, tensor_group, data_group, built, agree_overflow=cfg.amp == "fp16")
    module = _compiled(model, cfg)
    return Parallelized(module, module, stepping, policy)


def _follow(optimizer: torch.optim.Optimizer, stepping: torch.optim.Optimizer, lr_scheduler: Any) -> None:
    """The user's optimizer becomes a view of the one that steps (schedulers built over it before
    ``initialize`` drive the new one), and the scheduler passed to ``initialize`` drives it."""
    make_view(optimizer, stepping)
    retarget_scheduler(lr_scheduler, optimizer, stepping)


def _compiled(model: nn.Module, cfg: Config) -> nn.Module:
    if not cfg.compile:
        return model
    options = dict(cfg.compile) if isinstance(cfg.compile, Mapping) else {}
    return torch.compile(model, **options)  # type: ignore[return-value]
