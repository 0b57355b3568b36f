"""pytorch-accelerated's ``utils``: process decorators, batch limits, padding removal, seeding workers.

The process decorators run on ember's process group (``ember.distributed``): with one
process they simply call the function.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from ember import distributed
from ember.compat._not_provided import module_getattr
from ember.context import get_context
from ember.errors import TrainerError

__all__ = [
    "LIMIT_BATCHES_ENV_VAR",
    "DataLoaderSlice",
    "LimitBatches",
    "local_process_zero_first",
    "local_process_zero_only",
    "remove_padding",
    "worker_init_fn",
    "world_process_zero_only",
]

F = TypeVar("F", bound=Callable[..., Any])

LIMIT_BATCHES_ENV_VAR = "PT_ACC_LIMIT_BATCHES"
"""When set (to a number of batches), every Trainer built gets a ``LimitBatchesCallback``."""


class LimitBatches:
    """Within this context every new Trainer runs at most ``num_batches`` batches an epoch
    (it gets a :class:`~.callbacks.LimitBatchesCallback`), for a quick check of a program.

    Args:
        num_batches: batches per training and evaluation epoch.

    Example:
        >>> with LimitBatches(2):
        ...     trainer = Trainer(model, loss_func, optimizer)
    """

    def __init__(self, num_batches: int) -> None:
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
            raise TrainerError(f"LimitBatches needs a number of batches >= 1, got {num_batches!r}")
        self.num_batches = num_batches

    def __enter__(self) -> LimitBatches:
        os.environ[LIMIT_BATCHES_ENV_VAR] = str(self.num_batches)
        return self

    def __exit__(self, *exc: object) -> None:
        os.environ.pop(LIMIT_BATCHES_ENV_VAR, None)


class DataLoaderSlice:
    """The first ``slice_size`` batches of ``dl`` (its length is ``slice_size``); its other
    attributes are ``dl``'s (``trainer._eval_dataloader.device`` still works under
    ``PT_ACC_LIMIT_BATCHES``, as pytorch-accelerated's progressive-resizing example reads it).

    Args:
        dl: a DataLoader or other iterable.
        slice_size: how many batches to yield.
    """

    def __init__(self, dl: Iterable[Any], slice_size: int) -> None:
        self.dl, self.slice_size = dl, slice_size

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(self.dl, self.slice_size)

    def __len__(self) -> int:
        return self.slice_size

    def __getattr__(self, name: str) -> Any:
        if name == "dl":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dl, name)


def _local_rank() -> int:
    return get_context(default=True).local_rank


def local_process_zero_only(func: F) -> F:
    """Run ``func`` on the first process of each machine only (the others get None); every
    process waits at a barrier after it.

    Example:
        >>> @local_process_zero_only
        ... def download(): ...
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs) if _local_rank() == 0 else None
        distributed.barrier()
        return result

    return wrapper  # type: ignore[return-value]


def local_process_zero_first(func: F) -> F:
    """Run ``func`` on the first process of each machine, then (after a barrier) on the others:
    e.g. a download that the others then find in the cache."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first = _local_rank() == 0
        result = func(*args, **kwargs) if first else None
        distributed.barrier()
        return result if first else func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def world_process_zero_only(func: F) -> F:
    """Run ``func`` on the job's first process only (the others get None); every process waits
    at a barrier after it."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs) if distributed.rank() == 0 else None
        distributed.barrier()
        return result

    return wrapper  # type: ignore[return-value]


def worker_init_fn(worker_id: int) -> int:
    """A DataLoader ``worker_init_fn``: the worker's seed from this process's current torch seed,
    so workers of different processes and epochs differ (the Trainer's loaders use it)."""
    return torch.seed() + worker_id


def remove_padding(padded_tensor: torch.Tensor, pad_value: Any) -> torch.Tensor:
    """``padded_tensor`` without the entries along the first dimension that are all ``pad_value``
    (e.g. after gathering padded predictions from every process).

    Example:
        >>> remove_padding(torch.tensor([0, 1, -1, -1]), -1)
        tensor([0, 1])
    """
    padding = padded_tensor == pad_value
    while padding.ndim > 1:
        padding = padding.all(dim=-1)
    return padded_tensor[~padding, ...]


__getattr__ = module_getattr(__name__, "pytorch_accelerated.utils", {
    "ModelEma": "use ember.trainer.hooks.EMAHook (an exponential moving average of the weights, kept in checkpoints)",
})  # fmt: skip
