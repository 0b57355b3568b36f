"""Colossal-AI's ``colossalai.utils``: ``get_dataloader``, ``get_current_device``, ``checkpoint``,
``print_rank_0``, ``is_using_pp``, ``Timer``/``MultiTimer``.

``get_dataloader`` keeps Colossal-AI's signature and builds ember's loader with
:func:`ember.get_dataloader`: with ``add_sampler=True`` a resumable sampler sharded across the
data-parallel ranks, with ``add_sampler=False`` a plain loader every rank reads whole (marked
so that ``initialize`` and the Trainer keep it whole).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import ember
from ember import context as _context
from ember import distributed
from ember.compat._not_provided import module_getattr
from ember.parallel import checkpointing as activation_checkpointing

from .timer import MultiTimer, Timer

__all__ = ["MultiTimer", "Timer", "checkpoint", "get_current_device", "get_dataloader", "is_using_pp", "print_rank_0"]


def get_dataloader(
    dataset: Dataset[Any],
    shuffle: bool = False,
    seed: int = 1024,
    add_sampler: bool = True,
    drop_last: bool = False,
    pin_memory: bool = False,
    num_workers: int = 0,
    **kwargs: Any,
) -> DataLoader[Any]:
    """A DataLoader over ``dataset`` with Colossal-AI's arguments, built by ember.

    Args:
        dataset: a map-style dataset.
        shuffle: reshuffle every epoch.
        seed: the shuffling seed (the same on every rank; the order of epoch ``e`` is a
            function of ``(seed, e)``).
        add_sampler: shard across the data-parallel ranks (False: every rank reads all of it).
        drop_last: drop the last incomplete batch.
        pin_memory: pin host memory.
        num_workers: loader worker processes.
        **kwargs: ``batch_size`` and other ``DataLoader`` arguments.

    Returns:
        The loader (see :func:`ember.get_dataloader`).

    Example:
        >>> test_dl = get_dataloader(test_ds, add_sampler=False, batch_size=gpc.config.BATCH_SIZE)
    """
    batch_size = kwargs.pop("batch_size", 1)
    return ember.get_dataloader(
        dataset, shuffle=shuffle, batch_size=batch_size, add_sampler=add_sampler, num_workers=num_workers,
        pin_memory=pin_memory, drop_last=drop_last, seed=seed, **kwargs,
    )  # fmt: skip


def get_current_device() -> torch.device:
    """This process's device (``cuda:<local rank>`` on a GPU machine, else the CPU)."""
    return _context.get_context(default=True).device


def checkpoint(function: Callable[..., Any], activation_offload: bool, *args: Any, use_reentrant: bool = True) -> Any:
    """Colossal-AI's activation checkpoint: run ``function(*args)`` keeping only its inputs, and
    recompute it in the backward pass with the random state it had (dropout draws the same masks).

    ember always runs torch's non-reentrant checkpoint (:func:`ember.parallel.checkpointing.checkpoint`):
    the same gradients as without checkpointing, also for inputs that do not require grad;
    ``use_reentrant`` is accepted for the signature. ``activation_offload=True`` keeps the saved
    inputs in host memory on a GPU; on a CPU they are there already (a note is logged once).

    Args:
        function: the computation, called as ``function(*args)``.
        activation_offload: keep the saved inputs in host memory.
        *args: its inputs.
        use_reentrant: accepted; ember does not use the reentrant variant.

    Returns:
        What ``function`` returns.

    Example:
        >>> x = checkpoint(self.block, False, x)
    """
    return activation_checkpointing.checkpoint(function, *args, offload=activation_offload)


def print_rank_0(msg: str, logger: Any = None) -> None:
    """Print ``msg`` (or log it with ``logger.info``) on rank 0 only.

    Example:
        >>> print_rank_0(f"epoch {epoch}: loss {loss:.3f}")
    """
    if distributed.rank() == 0:
        if logger is None:
            print(msg, flush=True)
        else:
            logger.info(msg)


def is_using_pp() -> bool:
    """Whether the launched job has a pipeline of more than one stage (``parallel.pipeline``).

    Example:
        >>> if is_using_pp():
        ...     model = pipelinable.partition(1, gpc.pipeline_parallel_size, gpc.get_local_rank(ParallelMode.PIPELINE))
    """
    return _context.is_launched() and _context.get_context().layout.pipeline > 1


__getattr__ = module_getattr(__name__, "colossalai.utils", {
    "checkpointing": "save with ember's checkpoints: trainer hooks.SaveCheckpointHook / ember.checkpoint.save",
    "save_checkpoint": "use ember.checkpoint.save(path, trainer) (or hooks.SaveCheckpointHook)",
    "load_checkpoint": "use trainer.fit(..., resume=path) or ember.checkpoint.load(path, trainer)",
    "clip_grad_norm_fp32": "set clip_grad_norm in the config: the Engine clips at each update",
    "colo_set_process_memory_fraction": "use torch.cuda.set_per_process_memory_fraction",
})  # fmt: skip
