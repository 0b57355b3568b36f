"""``initialize``: turn a model, optimizer, loss and dataloaders into an Engine, from the config."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from ember import context as _context
from ember.amp import MasterShard, MasterWeights, Precision, make_precision
from ember.config import Config, load_config, merge_configs
from ember.data import is_kept_unsharded, make_resumable
from ember.engine import Criterion, Engine
from ember.errors import ConfigError, EngineError, LaunchError
from ember.launcher import use_deterministic_kernels
from ember.parallel.checkpointing import apply_activation_checkpointing
from ember.parallel.master_zero import MasterShardPolicy
from ember.parallel.moe_policy import sync_replicas
from ember.parallel.pipeline import check_microbatches
from ember.parallel.strategy import Parallelized, ParallelPlan, check_parallel, parallelize


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

    Moves the model to this process's device, compiles it when ``compile`` is set, makes it
    parallel as ``parallel``/``zero`` say (DDP when the world has several processes; ZeRO-1,
    FSDP2, tensor parallel, see ``docs/parallel.md``), and gives the dataloaders ember's
    resumable sampler, sharded by the *data-parallel* rank and size (ranks of one
    tensor-parallel group see the same batches). A loader built with
    ``get_dataloader(..., add_sampler=False)`` (or marked with
    :func:`ember.data.keep_unsharded`) is returned as it is: every rank reads all of it.

    Under pipeline parallelism (``parallel.pipeline``) each rank keeps one stage of the model
    (``engine.model``), and ``engine.schedule`` is the Trainer schedule that runs the pipeline:
    train with ``Trainer(engine, schedule=engine.schedule)``.

    Under ZeRO and FSDP2/tensor parallelism the optimizer that steps is a new one built from
    ``optimizer``'s class, defaults and param groups (``engine.optimizer``), and ``optimizer``
    becomes a view of it (the same param groups and state), so a scheduler built over
    ``optimizer`` before this call keeps setting the learning rate that steps, whether it is
    passed here (it is then re-pointed at ``engine.optimizer``) or not.

    Args:
        model: the model (an ``nn.Module``).
        optimizer: an optimizer over the model's (and the criterion's) parameters.
        criterion: the loss, called as ``criterion(output, label)``.
        train_dataloader: the training loader, made distributed/resumable if needed.
        test_dataloader: the evaluation loader, likewise.
        lr_scheduler: returned (checked to drive ``optimizer``; re-pointed at ``engine.optimizer``).
        config: settings for this Engine only, merged on top of the launched config (a file
            path, a dict or a Config). Works without ``ember.launch`` in a single process.

    Returns:
        ``(engine, train_dataloader, test_dataloader, lr_scheduler)``.

    Raises:
        ConfigError: bad ``parallel``/``zero`` settings, a missing tensor-parallel plan, a
            pipeline split point that is not a layer, microbatches that do not divide the batch
            size, sizes that do not fit the world (all raised before any collective).
        EngineError: unusable model, optimizer, criterion, scheduler or dataloader.

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
    plan = check_parallel(cfg, model, optimizer, ctx.world_size)
    precision = make_precision(cfg.amp, ctx.device, dict(cfg.grad_scaler), cfg.master_weights)
    _check_master_weights(precision, plan)
    check_microbatches(train_dataloader, cfg)
    apply_activation_checkpointing(model, cfg.get("activation_checkpointing"))
    if cfg.deterministic:
        use_deterministic_kernels()

    model.to(ctx.device)
    if isinstance(criterion, nn.Module):
        criterion.to(ctx.device)
    built = _parallelize(model, optimizer, cfg, ctx, plan, lr_scheduler, precision)
    if built.sequence is not None:  # context parallelism: the loss averaged over the context group
        criterion = built.sequence.wrap_criterion(criterion)
    engine = Engine(
        built.model if built.model is not None else model,
        built.optimizer,
        criterion,
        ctx.device,
        gradient_accumulation=cfg.gradient_accumulation,
        clip_grad_norm=cfg.clip_grad_norm,
        clip_grad_value=cfg.clip_grad_value,
        gradient_handlers=cfg.gradient_handler,
        nonfinite_loss=cfg.get("nonfinite_loss", "error"),
        precision=precision,
        train_module=built.train_module,
        eval_module=built.eval_module,
        parallel=built.policy,
        data_parallel=(plan.layout.coords(ctx.rank)["data"], plan.layout.data),
        config=cfg,
    )
    shard = (engine.data_parallel_rank, engine.data_parallel_size)
    train_dataloader = _prepare_loader(train_dataloader, ctx, shard)
    test_dataloader = _prepare_loader(test_dataloader, ctx, shard)
    if built.sequence is not None:  # context parallelism: each rank gets its slice of every sequence
        train_dataloader = built.sequence.wrap_loader(train_dataloader)
        test_dataloader = built.sequence.wrap_loader(test_dataloader)
    return engine, train_dataloader, test_dataloader, lr_scheduler


def _check_master_weights(precision: Precision, plan: ParallelPlan) -> None:
    """What master weights do not run with: a ConfigError before any collective."""
    if not isinstance(precision, MasterWeights):
        return
    layout = plan.layout
    clash = {"zero.stage": plan.zero_stage if plan.zero_stage > 1 else 0, "parallel.tensor.size": layout.tensor,
             "parallel.pipeline.size": layout.pipeline, "parallel.context": layout.context}  # fmt: skip
    with_it = [f"{key}={value}" for key, value in clash.items() if value > (0 if key == "zero.stage" else 1)]
    if with_it:
        raise ConfigError(
            f"config master_weights=True cannot be combined with {', '.join(with_it)} in this ember version; it runs "
            "alone, with data parallelism, zero=dict(stage=1) (sharded masters) and parallel.expert. Under FSDP2 use "
            "zero=dict(stage=2 or 3, mixed_precision='bf16'), which keeps fp32 shards and computes in bf16"
        )


def _parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: Config,
    ctx: _context.Context,
    plan: ParallelPlan,
    lr_scheduler: Any,
    precision: Precision,
) -> Parallelized:
    """:func:`parallelize`, with the fp32 masters made first under ``master_weights``: from weights
    equal on every replica, before DDP sees the low-precision parameters; ZeRO-1 shards them."""
    if not isinstance(precision, MasterWeights):
        return parallelize(model, optimizer, cfg, ctx, plan, lr_scheduler)
    layout = plan.layout
    shard = None
    if ctx.world_size > 1:
        sync_replicas(model, layout)
        if plan.zero_stage == 1:
            group = _context.get_group("data", layout)
            shard = MasterShard(layout.coords(ctx.rank)["data"], layout.data, group)
            plan = dataclasses.replace(plan, zero_stage=0)  # DDP; the masters are sharded here instead
    precision.prepare(model, optimizer, shard)
    built = parallelize(model, optimizer, cfg, ctx, plan, lr_scheduler)
    # DCP keys optimizer state by the model's parameters, and the optimizer holds the masters: whole
    # (unsharded) checkpoints only, refused by the policy with its clear error.
    built.policy.sharded_state = False
    base = "one process" if built.policy.name == "none" else built.policy.name
    built.policy.name = f"{base} with master_weights=True"
    if shard is not None:
        built.policy = MasterShardPolicy(built.policy.ddp, precision)  # type: ignore[attr-defined]
    return built


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


def _prepare_loader(
    loader: DataLoader[Any] | None, ctx: _context.Context, shard: tuple[int, int]
) -> DataLoader[Any] | None:
    if loader is None:
        return None
    if not isinstance(loader, DataLoader):
        raise EngineError(f"dataloaders must be torch DataLoaders, got {type(loader).__name__}")
    if is_kept_unsharded(loader):  # the user's choice (get_dataloader(add_sampler=False)): every rank reads it all
        return loader
    sampler_name = type(loader.sampler).__name__
    if ctx.world_size == 1 and sampler_name not in ("RandomSampler", "SequentialSampler", "DistributedSampler"):
        return loader  # a custom sampler: keep it; mid-epoch resume then replays from the epoch start
    return make_resumable(loader, rank=shard[0], num_replicas=shard[1])
