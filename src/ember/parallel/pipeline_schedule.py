"""The Trainer's schedule for pipeline parallelism, on ``torch.distributed.pipelining``.

:class:`PipelineSchedule` implements the Trainer's ``Schedule`` protocol
(:mod:`ember.trainer.schedule`): each training batch runs through torch's ``ScheduleGPipe`` or
``Schedule1F1B`` (the first stage ``step(x)``, the last ``step(target=y, losses=...)``, the
others ``step()``), split into ``parallel.pipeline.microbatches`` micro-batches; evaluation
runs the same schedule forward-only (``schedule.eval``). The last stage's loss (and output) is
broadcast over the pipeline group so that every rank's hooks see them.

:func:`build_pipeline` builds this rank's stage, its optimizer, policy and schedule.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ember.batch import batch_size, split_batch, to_device
from ember.config import Config
from ember.errors import DataError, EngineError
from ember.parallel.pipeline import PipelineOnly, StageModule, iter_stage_tensors, stage_optimizer, stage_plan
from ember.parallel.pipeline_policy import PipelinePolicy

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from ember.context import Context

__all__ = ["PipelineSchedule", "build_pipeline"]


class _Loss:
    """The loss torch's schedule calls per micro-batch: the Engine's criterion, scaled (by the
    accumulation factor, and by the fp16 loss scale), recorded."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.factor = 1.0
        self.recorded: list[torch.Tensor] = []

    def __call__(self, output: Any, target: Any) -> torch.Tensor:
        loss = self.engine.criterion(output, target)
        self.recorded.append(loss.detach())
        return self.engine.precision.scale(loss * self.factor)


class PipelineSchedule:
    """Runs each batch through the pipeline; every pipeline rank of a data replica gets the same batch.

    Gradients: each micro-batch's loss is multiplied by ``1 / (microbatches × accumulation)``
    (torch's own ``scale_grads`` is off, as it would also rescale the gradients of earlier
    accumulation micro-steps), so an update equals the one-process update on the whole batch.
    A batch that ``microbatches`` does not divide (an epoch's last) runs in ``gcd(batch,
    microbatches)`` micro-batches with GPipe: the same gradients.

    Attributes:
        broadcast_output: send the last stage's output to the other stages each batch, so that
            hooks such as ``AccuracyHook`` work on every rank (set False for large outputs, e.g. a
            language model's logits: other stages then see ``output=None``).

    Without a Trainer, an Engine loop runs a batch with ``engine.schedule.forward_backward(engine,
    batch, boundary)`` (the schedule takes the Engine where a Trainer would be) and then
    ``engine.step()``, as Colossal-AI's ``engine.execute_schedule`` loop does.

    Under 2-D/2.5-D/3-D tensor parallelism (``row_blocks`` R > 1: each rank of a stage computes
    one of R blocks of a micro-batch's rows) the batch's rows are reordered before the split into
    micro-batches, so that the output a rank's last stage returns is its contiguous block of the
    *whole* batch, in order: what the grid's ``Accuracy2D``/``2p5D``/``3D`` pair with the whole
    label. The batch size must then be a multiple of ``R × micro-batches``.

    Example:
        >>> engine, train_dl, test_dl, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), train_dl, test_dl)
        >>> Trainer(engine).fit(train_dl, epochs=2, hooks=[hooks.LossHook()])   # picks engine.schedule
        >>> for x, y in train_dl:                                               # or the Engine loop
        ...     result = engine.schedule.forward_backward(engine, (x, y), boundary=True)
        ...     engine.step()                                                   # result["loss"]: the batch's
    """

    def __init__(
        self, submod: nn.Module, stage: StageModule, stage_index: int, num_stages: int, microbatches: int,
        schedule: str, group: dist.ProcessGroup, device: torch.device,
    ) -> None:  # fmt: skip
        self.submod, self.stage = submod, stage
        self.stage_index, self.num_stages = stage_index, num_stages
        self.microbatches, self.schedule_name = microbatches, schedule
        self.group, self.device = group, device
        self.last_rank = dist.get_global_rank(group, num_stages - 1)
        self.broadcast_output = True
        self.row_blocks = 1
        self._runners: dict[tuple[Any, ...], tuple[PipelineScheduleSingle, _Loss]] = {}

    @property
    def is_first(self) -> bool:
        """True on the stage that takes the model's inputs."""
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """True on the stage that computes the output and the loss."""
        return self.stage_index == self.num_stages - 1

    def forward_backward(self, trainer: Any, batch: Any, boundary: bool) -> dict[str, Any]:
        """Forward and backward of one batch over all stages (see the Trainer's ``Schedule``);
        ``trainer`` may be the Engine itself (a loop without a Trainer)."""
        engine = getattr(trainer, "engine", trainer)
        engine.zero_grad()
        args, kwargs, label, size = self._inputs(engine, batch)
        micro = math.gcd(size, self.microbatches)
        args, kwargs, order = self._interleave(args, kwargs, label, size, micro)
        runner, loss = self._runner(engine, args, kwargs, order, micro, training=True)

        def run(factor: float) -> Any:
            loss.factor = factor / micro
            # The loss (and its scaling) lives on the last stage; the others get scaled
            # gradients from it and must unscale them: give their scaler its scale too.
            engine.precision.scale(torch.zeros((), device=self.device))
            return self._step(runner, args, kwargs, order, training=True)

        output = engine.run_backward(run, boundary=True if boundary else None)
        return self._result(output, loss, micro, label, size)

    def forward(self, trainer: Any, batch: Any) -> dict[str, Any]:
        """Forward-only pass of one evaluation batch (the Trainer calls it under ``no_grad``);
        ``trainer`` may be the Engine itself."""
        engine = getattr(trainer, "engine", trainer)
        args, kwargs, label, size = self._inputs(engine, batch)
        micro = math.gcd(size, self.microbatches)
        args, kwargs, order = self._interleave(args, kwargs, label, size, micro)
        runner, loss = self._runner(engine, args, kwargs, order, micro, training=False)
        loss.factor = 1.0
        output = self._step(runner, args, kwargs, order, training=False)
        return self._result(output, loss, micro, label, size)

    # -- helpers ------------------------------------------------------------------------------
    def _inputs(self, engine: Any, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any], Any, int]:
        batch = to_device(batch, engine.device)
        args, kwargs, label = split_batch(batch)  # the Trainer's conventions (ember.batch)
        if label is None:
            raise EngineError(
                "pipeline parallelism computes the loss on the last stage from the batch's label: batches must "
                "be (inputs..., label) tuples or dicts with a 'label'/'target' key"
            )
        return args, kwargs, label, batch_size(batch)

    def _interleave(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], label: Any, size: int, micro: int
    ) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
        """The batch's tensors (and label) with their rows reordered for ``row_blocks`` (see the
        class): row block i of micro-batch j is row block (i, j) of the whole batch."""
        blocks = self.row_blocks
        if blocks == 1 or micro == 1:
            return args, kwargs, label
        if size % (blocks * micro):
            raise DataError(
                f"a batch of {size} rows: the pipeline's {micro} micro-batches are each split into {blocks} row "
                f"blocks over the tensor grid, so the batch size must be a multiple of {blocks * micro}"
            )

        def reorder(value: Any) -> Any:
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != size:
                return value
            rest = value.shape[1:]
            return value.reshape(blocks, micro, -1, *rest).transpose(0, 1).reshape(size, *rest)

        return tuple(reorder(a) for a in args), {k: reorder(v) for k, v in kwargs.items()}, reorder(label)

    def _runner(
        self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: Any, micro: int, training: bool
    ) -> tuple[PipelineScheduleSingle, _Loss]:
        """A torch schedule for these input shapes (a stage's buffers are sized at its first step)."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        shapes = tuple((tuple(t.shape), t.dtype) for t in iter_stage_tensors(args, kwargs))
        target = (tuple(label.shape), label.dtype) if isinstance(label, torch.Tensor) else None
        use_1f1b = self.schedule_name == "1f1b" and micro >= self.num_stages
        key = (training, micro, use_1f1b, shapes, target)
        if key not in self._runners:
            stage = PipelineStage(self.submod, self.stage_index, self.num_stages, self.device, group=self.group)
            loss = _Loss()
            cls = Schedule1F1B if use_1f1b else ScheduleGPipe
            self._runners[key] = (cls(stage, micro, loss_fn=loss, scale_grads=False), loss)
        runner, loss = self._runners[key]
        loss.engine, loss.recorded = engine, []
        self.stage.autocast = engine.precision.autocast
        return runner, loss

    def _step(
        self, runner: PipelineScheduleSingle, args: tuple[Any, ...], kwargs: dict[str, Any], label: Any,
        training: bool,
    ) -> Any:  # fmt: skip
        call = runner.step if training else runner.eval
        if self.is_first:
            return call(*args, **kwargs)
        if self.is_last:
            return call(target=label, losses=[])
        return call()

    def _result(self, output: Any, loss: _Loss, micro: int, label: Any, size: int) -> dict[str, Any]:
        """Broadcast the last stage's mean loss (and output) over the pipeline group."""
        payload: list[Any] = [None, None]
        if self.is_last:
            # The last micro-batches' losses: a stage's first step also calls the loss on
            # placeholder data while torch infers the shapes it sends.
            payload[0] = torch.stack(loss.recorded[-micro:]).mean().float().cpu()
            if self.broadcast_output and isinstance(output, torch.Tensor):
                payload[1] = output.detach().cpu()
        dist.broadcast_object_list(payload, src=self.last_rank, group=self.group)
        value = payload[0].to(self.device)
        if not self.is_last:
            output = payload[1].to(self.device) if payload[1] is not None else None
        elif isinstance(output, torch.Tensor):
            output = output.detach()
        return {"loss": value, "output": output, "label": label, "batch_size": size}


def build_pipeline(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Config, ctx: Context, mesh: DeviceMesh,
    stages: list[list[str]], tensor_plan: dict[str, Any] | None = None, zero_stage: int = 0, grid: bool = False,
) -> tuple[StageModule, nn.Module, torch.optim.Optimizer, PipelinePolicy]:  # fmt: skip
    """This rank's stage of ``model`` and what the Engine needs to train it.

    Args:
        model: the full model (on ``ctx.device``); this rank keeps only its stage's layers.
        optimizer: the user's optimizer over the full model (not stepped yet).
        cfg: the Engine's config (``parallel.pipeline`` settings).
        ctx: this rank's context.
        mesh: the ``("pipeline", "data", "tensor")`` mesh; the stage index is this rank's
            ``"pipeline"`` coordinate.
        stages: the layer names of every stage (from :func:`~ember.parallel.pipeline.split_model`).
        tensor_plan: the resolved tensor-parallel plan of the whole model, or None; each stage
            applies the entries inside its layers on the ``"tensor"`` dim.
        zero_stage: 1 for a ZeroRedundancyOptimizer over the ``"data"`` dim, else 0.
        grid: the model's layers are 2-D/2.5-D/3-D grid layers (each rank holds its own blocks:
            only the replicas of a block are made equal, see :func:`~ember.parallel.grid_plan.sync_replicas`).

    Returns:
        ``(stage, guard, optimizer, policy)``: the :class:`StageModule` (the Engine's
        ``model``), the module ``engine(x)`` runs through (it raises, pointing at the Trainer),
        the user's optimizer class over the stage's parameters (a ZeroRedundancyOptimizer of it
        under ZeRO-1), and the :class:`PipelinePolicy`, whose ``batch_schedule`` is the
        :class:`PipelineSchedule` (``engine.schedule``).
    """
    from ember.parallel.optim import parameter_names, rebuild_optimizer
    from ember.parallel.tensor import apply_tensor_parallel
    from ember.parallel.zero import zero_optimizer

    pipe = cfg.parallel.pipeline
    coordinate = mesh.get_coordinate()
    if coordinate is None:  # unreachable: every rank is in the mesh
        raise RuntimeError("this rank is not in the device mesh")
    index = coordinate[0]
    stage = StageModule(model, stages[index]).to(ctx.device)
    layout = f"pipeline ×{pipe.size} ({pipe.schedule}, stage {index}: {stages[index][0]}…{stages[index][-1]})"
    # The ranks holding this stage (its tensor peers and data replicas) start from the same
    # weights: those of the stage's (data 0, tensor 0) rank.
    for dim in ("data",) if grid else ("tensor", "data"):
        if mesh[dim].size() > 1:
            group = mesh[dim].get_group()
            for tensor in [*stage.parameters(), *stage.buffers()]:
                dist.broadcast(tensor.data, src=dist.get_global_rank(group, 0), group=group)
    stepping, positions = stage_optimizer(optimizer, stage)
    part = stage_plan(tensor_plan, stage.layer_names) if tensor_plan else {}
    if part:
        names = parameter_names(stage)
        apply_tensor_parallel(stage, part, mesh["tensor"])
        stepping = rebuild_optimizer(stepping, stage, names, "tensor parallelism")
        layout += f" × tensor {mesh['tensor'].size()} ({len(part)} modules split)"
    elif tensor_plan:
        layout += f" × tensor {mesh['tensor'].size()} (no plan entry in this stage: replicated)"
    data_group = None
    if mesh["data"].size() > 1:
        # Not DDP: torch's PipelineStage drives DDP's reducer by hand, which fails on gloo (the
        # reducer asserts on its first bucket rebuild); the policy averages gradients instead.
        data_group = mesh["data"].get_group()
        layout += f" × data {mesh['data'].size()}"
    if zero_stage == 1:
        stepping = zero_optimizer(stepping, mesh["data"].get_group())
        layout += " + ZeRO-1"
    group = mesh["pipeline"].get_group()
    tensor_group = None
    if grid:
        from ember.layout import TENSOR_SUB_DIMS, ParallelLayout
        from ember.parallel.grid_plan import sync_replicas

        fine = ParallelLayout.from_config(cfg.parallel, ctx.world_size)
        sync_replicas(stage, None)  # the blocks replicated inside the grid; "data" was broadcast above
        tensor_group = mesh["tensor"].get_group() if mesh["tensor"].size() > 1 else None
        layout += f" × {fine.tensor_mode} tensor {fine.tensor}"
    policy = PipelinePolicy(
        group, positions, layout, data_group, zero=zero_stage == 1, tensor_group=tensor_group,
        agree_overflow=cfg.amp == "fp16", grid=grid,
    )  # fmt: skip
    policy.module = stage
    micro = pipe.microbatches or pipe.size
    policy.batch_schedule = PipelineSchedule(stage, stage, index, pipe.size, micro, pipe.schedule, group, ctx.device)
    if grid:
        axes = TENSOR_SUB_DIMS[fine.tensor_mode]  # a batch's rows are split over all axes but the last
        policy.batch_schedule.row_blocks = fine.tensor // fine.size(axes[-1]) if axes else 1
    return stage, PipelineOnly(stage), stepping, policy
