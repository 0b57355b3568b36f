"""Pipeline parallelism: split a sequential model into stages, one per rank of the ``"pipeline"`` dim.

The model is read as a sequence of layers: its top-level children in registration order, with
``nn.ModuleList``/``nn.Sequential`` children expanded into their items (``"blocks.0"``,
``"blocks.1"``, ...). Its forward must be exactly those layers applied in order (glue such as
pooling or reshapes belongs in a module). ``parallel.pipeline.split_points`` names the layers
that start stages 1, 2, ...; without them the layers are split evenly by count.

Each rank keeps only its stage (a :class:`StageModule` whose ``state_dict`` keys are the model's
own), wraps it in torch's :class:`~torch.distributed.pipelining.PipelineStage` and runs it with
``ScheduleGPipe`` or ``Schedule1F1B`` through :class:`~ember.parallel.pipeline_schedule.PipelineSchedule`,
the Trainer's schedule. With ``parallel.tensor`` each stage's layers are tensor-parallel over
the ``"tensor"`` dim (the plan entries inside the stage). :class:`~ember.parallel.pipeline_policy.PipelinePolicy`
makes clipping and ``engine.state_dict()`` span every stage and tensor shard, and with data
replicas (``parallel.data > 1``) averages each stage's gradients over the ``"data"`` dim at the
end of every accumulation cycle.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ember.config import Config
from ember.errors import ConfigError, EngineError

__all__ = ["StageModule", "check_microbatches", "sequential_layers", "split_model", "stage_optimizer", "stage_plan"]


def sequential_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model as a sequence of ``(name, layer)``: top-level children, stacks expanded one level.

    Example:
        >>> [name for name, _ in sequential_layers(gpt)]
        ['embed', 'blocks.0', 'blocks.1', 'head']
    """
    layers: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.Sequential)):
            layers.extend((f"{name}.{i}", item) for i, item in child.named_children())
        else:
            layers.append((name, child))
    return layers


def split_model(model: nn.Module, size: int, split_points: Sequence[str] | None = None) -> list[list[str]]:
    """The layer names of each of ``size`` stages (see :func:`sequential_layers`).

    Args:
        model: the full model.
        size: the number of stages.
        split_points: the names of the layers that start stages 1 … size-1 (None: an even split
            of the layers by count, the first stages taking one more when it does not divide).

    Raises:
        ConfigError: a split point that is not a layer (the message lists the top-level
            children and the layers), split points out of order or not ``size - 1`` of them,
            fewer layers than stages, parameters or buffers directly on the root module,
            parameters shared between stages.
    """
    layers = sequential_layers(model)
    names = [name for name, _ in layers]
    own = [n for n, _ in model.named_parameters(recurse=False)] + [n for n, _ in model.named_buffers(recurse=False)]
    if own:
        raise ConfigError(
            f"pipeline parallelism cannot place {own}, held by the model's root module itself: move them into "
            "a child module (e.g. an embedding layer) so that each belongs to one stage"
        )
    if len(layers) < size:
        raise ConfigError(
            f"config parallel.pipeline.size={size}, but the model has only {len(layers)} layers to split "
            f"({names}): use at most {len(layers)} stages"
        )
    if split_points is None:
        base, extra = divmod(len(layers), size)
        bounds = [0]
        for stage in range(size):
            bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    else:
        bounds = [0, *_split_indices(model, names, size, list(split_points)), len(layers)]
    stages = [names[bounds[i] : bounds[i + 1]] for i in range(size)]
    _check_no_shared_parameters(model, stages)
    return stages


def _split_indices(model: nn.Module, names: list[str], size: int, points: list[str]) -> list[int]:
    children = [n for n, _ in model.named_children()]
    for point in points:
        if point not in names:
            raise ConfigError(
                f"config parallel.pipeline.split_points names {point!r}, which is not a layer of the model. "
                f"Its top-level children are {children}; a split point is one of the layers {names} "
                "(children, with ModuleList/Sequential items as 'name.i')"
            )
    if len(points) != size - 1:
        raise ConfigError(
            f"config parallel.pipeline.split_points has {len(points)} names for {size} stages: give {size - 1} "
            "(the first layer of each stage after the first)"
        )
    indices = [names.index(p) for p in points]
    if indices != sorted(set(indices)) or indices[0] == 0:
        raise ConfigError(
            f"config parallel.pipeline.split_points {points} must name distinct layers in model order, after the "
            f"first layer {names[0]!r} (the model's layers: {names})"
        )
    return indices


def _check_no_shared_parameters(model: nn.Module, stages: list[list[str]]) -> None:
    owner: dict[int, int] = {}
    for index, stage in enumerate(stages):
        for name in stage:
            for p in model.get_submodule(name).parameters():
                if owner.setdefault(id(p), index) != index:
                    raise ConfigError(
                        f"layer {name!r} of pipeline stage {index} shares a parameter with stage {owner[id(p)]} "
                        "(tied weights): pipeline stages cannot share parameters; untie them or move the split"
                    )


class StageModule(nn.Module):
    """One pipeline stage: some of the model's layers, under their own names, run in order.

    ``state_dict()`` keys are the full model's (``"blocks.2.attn.q_proj.weight"``), so a stage's
    state is a part of the one-process state dict.

    Args:
        model: the full model.
        names: this stage's layers, in model order (from :func:`split_model`).
    """

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.layer_names = tuple(names)
        for name in names:
            parent: nn.Module = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = getattr(parent, part)
            parent.add_module(leaf, model.get_submodule(name))
        self.autocast: Any = None
        """A callable giving the autocast context the layers run in (set by the schedule), or None."""

    def forward(self, *args: Any) -> Any:
        """Apply the layers in order; a tuple output is unpacked into the next layer's arguments."""
        if self.autocast is None:
            return self._run(args)
        with self.autocast():
            return self._run(args)

    def _run(self, args: tuple[Any, ...]) -> Any:
        x: Any = args
        for name in self.layer_names:
            x = self.get_submodule(name)(*x) if isinstance(x, tuple) else self.get_submodule(name)(x)
        return x


class PipelineOnly(nn.Module):
    """What ``engine(x)`` runs through under pipeline parallelism: it explains the Trainer route."""

    def __init__(self, submod: nn.Module) -> None:
        super().__init__()
        self.submod = submod

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Raise: one rank cannot run the whole model; the pipeline schedule runs the batch."""
        raise EngineError(
            "under pipeline parallelism each rank holds one stage, so engine(x) cannot run the model: train "
            "with Trainer(engine, schedule=engine.schedule) (its fit/evaluate run the pipeline schedule)"
        )


def stage_optimizer(optimizer: torch.optim.Optimizer, stage: nn.Module) -> tuple[torch.optim.Optimizer, list[int]]:
    """The user's optimizer class over this stage's parameters, with every param group kept.

    Returns:
        The new optimizer, and for each of its parameters (in order) its position in the user's
        optimizer (the index ``Optimizer.state_dict()`` gives it in one process). Parameters of
        the optimizer that are not the model's (a criterion's) go to the last stage.
    """
    from ember.parallel.optim import constructor_defaults

    mine = {id(p) for p in stage.parameters()}
    groups, positions, position = [], [], 0
    for group in optimizer.param_groups:
        kept = []
        for p in group["params"]:
            if id(p) in mine:
                kept.append(p)
                positions.append(position)
            position += 1
        groups.append({**{k: v for k, v in group.items() if k not in ("params", "param_names")}, "params": kept})
    if not positions:
        raise ConfigError("a pipeline stage has no trainable parameters: move the split points so every stage has some")
    return type(optimizer)(groups, **constructor_defaults(optimizer)), positions


def stage_plan(plan: Mapping[str, Any], layer_names: Sequence[str]) -> dict[str, Any]:
    """The entries of a resolved tensor-parallel plan that fall inside a stage's layers.

    Args:
        plan: ``{module name: style}`` for the whole model (from
            :func:`~ember.parallel.tensor.resolve_plan`, so every entry names a real module).
        layer_names: the stage's layers (:attr:`StageModule.layer_names`).

    Example:
        >>> stage_plan({"blocks.0.mlp.fc1": "colwise", "blocks.1.mlp.fc1": "colwise"}, ["embed", "blocks.0"])
        {'blocks.0.mlp.fc1': 'colwise'}
    """
    return {
        name: style
        for name, style in plan.items()
        if any(name == layer or name.startswith(f"{layer}.") for layer in layer_names)
    }


def check_microbatches(loader: Any, cfg: Config) -> None:
    """Raise ConfigError when ``parallel.pipeline.microbatches`` does not divide the loader's batch size."""
    pipe = cfg.parallel.pipeline
    batch = getattr(loader, "batch_size", None)
    micro = pipe.microbatches or pipe.size
    if pipe.size > 1 and isinstance(batch, int) and batch % micro:
        fits = [m for m in range(1, batch + 1) if batch % m == 0 and (pipe.schedule != "1f1b" or m >= pipe.size)]
        raise ConfigError(
            f"config parallel.pipeline.microbatches={micro} does not divide the training batch size {batch}: "
            f"choose microbatches from {fits} or a batch size that is a multiple of {micro}"
        )


def iter_stage_tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    """The tensors among a batch's model inputs (what shapes the stage's communication buffers)."""
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor):
            yield value
