"""Colossal-AI's launch functions and ``initialize``, on ember's.

The difference worth a line: Colossal-AI defaults to ``backend="nccl"``; on a machine without
CUDA ember falls back to gloo and says so once (rank 0), where NCCL could not start at all.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember.config import ConfigSource
from ember.context import Context
from ember.engine import Engine
from ember.errors import EngineError
from ember.launcher import launcher_rank


def _backend(backend: str, rank: Any) -> str:
    """``backend``, or gloo for Colossal-AI's default nccl on a machine without CUDA."""
    if backend == "nccl" and not torch.cuda.is_available():
        if str(rank) == "0":  # before the launch only the launcher's variables say who is rank 0
            ember.get_dist_logger().warning("backend='nccl' needs CUDA, which this machine lacks: using 'gloo'")
        return "gloo"
    return backend


def launch(
    config: ConfigSource,
    rank: int,
    world_size: int,
    host: str,
    port: int,
    backend: str = "nccl",
    local_rank: int | None = None,
    seed: int = 1024,
    verbose: bool = True,
) -> Context:
    """Join the job as ``rank`` of ``world_size`` and load ``config`` (see :func:`ember.launch`).

    Args:
        config: a config file path, a dict or a :class:`~ember.compat.colossalai.context.Config`.
        rank: this process's global rank.
        world_size: the number of processes.
        host: rank 0's address.
        port: its port.
        backend: ``"nccl"`` (gloo on a machine without CUDA, with a warning) or ``"gloo"``.
        local_rank: the rank on this machine (picks the GPU); default ``rank``.
        seed: the base seed (each rank seeds with ``seed + rank``).
        verbose: log one line describing the job.

    Returns:
        ember's context (``ember.context``).

    Example:
        >>> colossalai.launch(config="config.py", rank=0, world_size=1, host="127.0.0.1", port=29500)
    """
    return ember.launch(
        config, rank=rank, world_size=world_size, host=host, port=port, backend=_backend(backend, rank),
        local_rank=local_rank, seed=seed, verbose=verbose,
    )  # fmt: skip


def launch_from_torch(config: ConfigSource, backend: str = "nccl", seed: int = 1024, verbose: bool = True) -> Context:
    """Launch from the variables ``torchrun`` sets (see :func:`ember.launch_from_torch`).

    Example:
        >>> colossalai.launch_from_torch(config="./config.py")   # torchrun --nproc_per_node 2 train.py
    """
    backend = _backend(backend, launcher_rank("torch"))
    return ember.launch_from_torch(config, backend=backend, seed=seed, verbose=verbose)


def launch_from_slurm(
    config: ConfigSource, host: str, port: int, backend: str = "nccl", seed: int = 1024, verbose: bool = True
) -> Context:
    """Launch from the variables ``srun`` sets (see :func:`ember.launch_from_slurm`)."""
    backend = _backend(backend, launcher_rank("slurm"))
    return ember.launch_from_slurm(config, host, port, backend=backend, seed=seed, verbose=verbose)


def launch_from_openmpi(
    config: ConfigSource, host: str, port: int, backend: str = "nccl", seed: int = 1024, verbose: bool = True
) -> Context:
    """Launch from the variables ``mpirun`` sets (see :func:`ember.launch_from_openmpi`)."""
    backend = _backend(backend, launcher_rank("openmpi"))
    return ember.launch_from_openmpi(config, host, port, backend=backend, seed=seed, verbose=verbose)


def initialize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    criterion: Any = None,
    train_dataloader: DataLoader[Any] | None = None,
    test_dataloader: DataLoader[Any] | None = None,
    lr_scheduler: Any = None,
    ophooks: Iterable[Any] | None = None,
    verbose: bool = True,
) -> tuple[Engine, DataLoader[Any] | None, DataLoader[Any] | None, Any]:
    """Build the Engine from the launched config: :func:`ember.initialize` with Colossal-AI's arguments.

    A :class:`~ember.compat.colossalai.pipeline.PipelinableModel` (from
    ``PipelinableContext.partition``) brings its stage boundaries as
    ``parallel.pipeline.split_points``, and the config's ``NUM_MICRO_BATCHES`` becomes
    ``parallel.pipeline.microbatches`` (unless that is set), for this Engine.

    Args:
        model: the model.
        optimizer: an optimizer over its parameters.
        criterion: the loss, ``criterion(output, label)``.
        train_dataloader: the training loader (sharded across ranks unless built with
            ``get_dataloader(add_sampler=False)``).
        test_dataloader: the test loader, likewise.
        lr_scheduler: returned as given (it keeps driving the optimizer that steps).
        ophooks: Colossal-AI's operator hooks; ember has none (only None or empty).
        verbose: accepted; ember's ``initialize`` logs nothing.

    Returns:
        ``(engine, train_dataloader, test_dataloader, lr_scheduler)``.

    Raises:
        EngineError: ``ophooks`` given, or what :func:`ember.initialize` refuses.

    Example:
        >>> engine, train_dl, test_dl, _ = colossalai.initialize(model, optimizer, criterion, train_dl, test_dl)
    """
    if ophooks:
        raise EngineError(
            "initialize(ophooks=...) has no ember counterpart (Colossal-AI's operator hooks serve its ZeRO memory "
            "tracing): remove it, and set zero=dict(stage=...) in the config for sharding"
        )
    return ember.initialize(
        model, optimizer, criterion, train_dataloader, test_dataloader, lr_scheduler, config=_pipeline_config(model)
    )


def _pipeline_config(model: nn.Module) -> dict[str, Any] | None:
    """This Engine's ``parallel.pipeline`` from a PipelinableModel's split and ``NUM_MICRO_BATCHES``."""
    config = ember.context.get_context(default=True).config
    pipeline: dict[str, Any] = {}
    points = getattr(model, "pipeline_split_points", None)
    if points is not None:
        pipeline["split_points"] = list(points)
    micro = config.get("NUM_MICRO_BATCHES") if config is not None else None
    if micro is not None and config is not None and not config.parallel.pipeline.microbatches:
        pipeline["microbatches"] = int(micro)
    return {"parallel": {"pipeline": pipeline}} if pipeline else None


def get_default_parser() -> argparse.ArgumentParser:
    """The command-line parser Colossal-AI scripts start from.

    Returns:
        A parser with ``--config``, ``--host``, ``--port``, ``--world_size``, ``--rank``,
        ``--local_rank`` and ``--backend`` (default ``"nccl"``); add your own arguments to it.

    Example:
        >>> args = get_default_parser().parse_args()
        >>> colossalai.launch(args.config, args.rank, args.world_size, args.host, args.port, args.backend)
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=str, help="the config file")
    parser.add_argument("--host", type=str, help="rank 0's address")
    parser.add_argument("--port", type=int, help="rank 0's port")
    parser.add_argument("--world_size", type=int, help="the number of processes")
    parser.add_argument("--rank", type=int, help="this process's global rank")
    parser.add_argument("--local_rank", type=int, help="this process's rank on its machine")
    parser.add_argument("--backend", type=str, default="nccl", help="nccl, or gloo")
    return parser
