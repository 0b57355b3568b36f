"""Pipeline parallelism: split a sequential model into stages, one per rank of the ``"pipeline"`` dim.

The model is read as a sequence of layers: its top-level children in registration order, with
``nn.ModuleList``/``nn.Sequential`` children expanded into their items (``"blocks.0"``,
``"blocks.1"``, ...). Its forward must be exactly those layers applied in order (glue such as
pooling or reshapes belongs in a module). ``parallel.pipeline.split_points`` names the layers
that start stages 1, 2, ...; without them the layers are split evenly by count.

Each rank keeps only its stage (a :class:`StageModule` whose ``state_dict`` keys are the model's
own), wraps it in torch's :class:`~torch.distributed.pipelining.PipelineStage` and runs it with
``ScheduleGPipe`` or ``Schedule1F1B`` through :class:`~ember.parallel.pipeline_schedule.PipelineSchedule`,
the Trainer's schedule. :class:`PipelinePolicy` makes clipping and ``engine.state_dict()`` span
every stage, and with data replicas (``parallel.data > 1``) averages each stage's gradients
over the ``"data"`` dim at the end of every accumulation cycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import distributed
from ember.config import Config
from ember.errors import ConfigError, EngineError
from ember.parallel.policy import ParallelPolicy, refuse_sharded

__all__ = ["PipelinePolicy", "StageModule", "check_microbatches", "sequential_layers", "split_model", "stage_optimizer"]


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


class PipelinePolicy(ParallelPolicy):
    """Clipping and state over all stages of the pipeline (and DDP's sync inside each stage).

    ``clip_grad_norm_`` reduces the squared norms of every stage. ``state_dicts`` gathers every
    stage's model and optimizer state onto global rank 0 in the one-process format (other ranks
    get ``{}``); ``load`` takes that full state on every rank, or on rank 0 only (broadcast),
    and gives each stage its part.

    Args:
        group: the pipeline process group of this rank.
        positions: for each parameter of this stage's optimizer, its index in the user's optimizer.
        description: what was built, for the log.
        data_group: the data-parallel group of this stage's replicas, or None.
    """

    keeps_partial_grads = False

    def __init__(
        self, group: dist.ProcessGroup, positions: list[int], description: str,
        data_group: dist.ProcessGroup | None = None,
    ) -> None:  # fmt: skip
        self.group = group
        self.positions = positions
        self.name = description
        self.data_group = data_group
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
                    dist.all_reduce(p.grad, group=self.data_group)
                    p.grad.div_(size)

    @torch.no_grad()
    def clip_grad_norm_(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        grads = [p.grad for p in params if p.grad is not None]
        local = nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        squared = local.float().pow(2).reshape(1).to(distributed.collective_device())
        dist.all_reduce(squared, group=self.group)
        total = squared.sqrt()[0].to(local.device)
        nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def state_dicts(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
        model_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        ours = optimizer.state_dict()
        indexed = {
            "state": {self.positions[int(i)]: _cpu(v) for i, v in ours["state"].items()},
            "param_groups": [{**g, "params": [self.positions[i] for i in g["params"]]} for g in ours["param_groups"]],
        }
        first = dist.get_global_rank(self.group, 0)
        gathered: list[Any] | None = [None] * dist.get_world_size(self.group) if dist.get_rank() == first else None
        dist.gather_object((model_state, indexed), gathered, dst=first, group=self.group)
        if dist.get_rank() != 0 or gathered is None:
            return {}, {}
        merged_model: dict[str, Any] = {}
        for stage_model, _ in gathered:
            merged_model.update(stage_model)
        return merged_model, _merge_optimizer([opt for _, opt in gathered])

    def sharded_state_dicts(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        raise refuse_sharded(self)

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], strict: bool = True
    ) -> dict[str, Any]:
        if state.get("sharded"):
            raise refuse_sharded(self)
        if distributed.any_true(not state["model"]):
            state = distributed.broadcast_object(state, src=0)
        own = model.state_dict()
        part = {k: v for k, v in state["model"].items() if k in own}
        missing = sorted(set(own) - set(part))
        if strict and missing:
            raise EngineError(f"the model state has no entries for {missing[:5]} of this pipeline stage")
        model.load_state_dict(part, strict=strict)
        local = {g: i for i, g in enumerate(self.positions)}
        full = state["optimizer"]
        optimizer.load_state_dict(
            {
                "state": {local[int(k)]: v for k, v in full["state"].items() if int(k) in local},
                "param_groups": [
                    {**g, "params": [local[i] for i in g["params"] if i in local]} for g in full["param_groups"]
                ],
            }
        )
        return state


def _merge_optimizer(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """One optimizer state dict from the stages' (already in global positions)."""
    state: dict[int, Any] = {}
    for s in stages:
        state.update(s["state"])
    groups = []
    for parts in zip(*(s["param_groups"] for s in stages), strict=True):
        groups.append({**parts[0], "params": sorted(i for g in parts for i in g["params"])})
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    return value


def iter_stage_tensors(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    """The tensors among a batch's model inputs (what shapes the stage's communication buffers)."""
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor):
            yield value
