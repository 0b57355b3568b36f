"""``initialize``: turn a model, optimizer, loss and dataloaders into an Engine, from the config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ember import context as _context
from ember.config import Config, load_config, merge_configs
from ember.data import make_resumable
from ember.engine import Criterion, Engine
from ember.errors import ConfigError, EngineError, LaunchError
from ember.parallel import wrap_data_parallel


def initialize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    criterion: Criterion | None = None,
    train_dataloader: DataLoader[Any] | None = None,
    test_dataloader: DataLoader[Any] | None = None,
    lr_scheduler: Any | None = None,
    config: str | os.PathLike[str] | Mapping[str, Any] | Config | None = None,
) -> tuple[Engine, DataLoader[Any] | None, DataLoader[Any] | None, Any | None]:
    """Wrap the user's training objects in an :class:`~ember.engine.Engine`.

    Moves the model to this process's device, compiles it when ``compile`` is set, wraps it in
    DDP when the world has several processes, and gives the dataloaders ember's resumable
    (and, under several processes, distributed) sampler when they lack it.

    Args:
        model: the model (an ``nn.Module``).
        optimizer: an optimizer over the model's (and the criterion's) parameters.
        criterion: the loss, called as ``criterion(output, label)``.
        train_dataloader: the training loader, made distributed/resumable if needed.
        test_dataloader: the evaluation loader, likewise.
        lr_scheduler: returned as is (checked to drive ``optimizer``).
        config: settings for this Engine only, merged on top of the launched config (a file
            path, a dict or a Config). Works without ``ember.launch`` in a single process.

    Returns:
        ``(engine, train_dataloader, test_dataloader, lr_scheduler)``.

    Example:
        >>> engine, train_dl, test_dl, sched = ember.initialize(model, opt, nn.CrossEntropyLoss(),
        ...                                                     train_dl, test_dl, sched,
        ...                                                     config={"gradient_accumulation": 4})
    """
    if not _context.is_launched() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise LaunchError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but ember was not launched in this process: "
            "call ember.launch_from_torch(config=...) before ember.initialize"
        )
    ctx = _context.get_context(default=True)
    base = ctx.config if ctx.config is not None else load_config(None)
    cfg = merge_configs(base, config) if config is not None else base
    _check_objects(model, optimizer, criterion, lr_scheduler)
    _check_parallel(cfg, ctx.world_size)
    if cfg.deterministic and not _context.is_launched():
        torch.use_deterministic_algorithms(True)

    model.to(ctx.device)
    if isinstance(criterion, nn.Module):
        criterion.to(ctx.device)
    eval_module: nn.Module = model
    if cfg.compile:
        options = dict(cfg.compile) if isinstance(cfg.compile, Mapping) else {}
        eval_module = torch.compile(model, **options)  # type: ignore[assignment]
    train_module = eval_module
    if ctx.world_size > 1:
        train_module = wrap_data_parallel(eval_module, ctx.device, cfg.ddp)

    engine = Engine(model, optimizer, criterion, cfg, ctx.device, train_module=train_module, eval_module=eval_module)
    return engine, _prepare_loader(train_dataloader, ctx), _prepare_loader(test_dataloader, ctx), lr_scheduler


def _check_objects(model: Any, optimizer: Any, criterion: Any, lr_scheduler: Any) -> None:
    if not isinstance(model, nn.Module):
        raise EngineError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise EngineError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}: "
            "build it as torch.optim.SGD(model.parameters(), lr=...)"
        )
    if criterion is not None and not callable(criterion):
        raise EngineError(f"criterion must be callable as criterion(output, label), got {type(criterion).__name__}")
    owned = {id(p) for p in model.parameters()}
    if isinstance(criterion, nn.Module):
        owned |= {id(p) for p in criterion.parameters()}
    for gi, group in enumerate(optimizer.param_groups):
        for pi, p in enumerate(group["params"]):
            if id(p) not in owned:
                raise EngineError(
                    f"the optimizer's param group {gi}, parameter {pi} (shape {tuple(p.shape)}) is not a "
                    "parameter of the model: build the optimizer from this model's parameters()"
                )
    if lr_scheduler is not None and getattr(lr_scheduler, "optimizer", optimizer) is not optimizer:
        raise EngineError("lr_scheduler drives a different optimizer than the one given to initialize")


def _check_parallel(cfg: Config, world_size: int) -> None:
    data = cfg.parallel.data
    if data is not None and data != world_size:
        raise ConfigError(
            f"config parallel.data={data} but the job has {world_size} process(es): set parallel.data="
            f"{world_size} or leave it unset, or launch {data} processes"
        )
    for kind in ("tensor", "pipeline"):
        size = cfg.parallel[kind].size
        if size > 1:
            raise ConfigError(
                f"config parallel.{kind}.size={size}: {kind} parallelism is not available in this ember "
                f"version; use data parallelism (leave parallel.{kind} unset)"
            )
    if cfg.zero is not None:
        raise ConfigError(
            "config key 'zero' is not available in this ember version: remove it (data parallelism "
            "with DDP is used when several processes run)"
        )


def _prepare_loader(loader: DataLoader[Any] | None, ctx: _context.Context) -> DataLoader[Any] | None:
    if loader is None:
        return None
    if not isinstance(loader, DataLoader):
        raise EngineError(f"dataloaders must be torch DataLoaders, got {type(loader).__name__}")
    sampler_name = type(loader.sampler).__name__
    if ctx.world_size == 1 and sampler_name not in ("RandomSampler", "SequentialSampler", "DistributedSampler"):
        return loader  # a custom sampler: keep it; mid-epoch resume then replays from the epoch start
    return make_resumable(loader)
