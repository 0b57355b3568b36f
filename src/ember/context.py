"""The global context: who this process is in the job, on which device, with which config.

:func:`ember.launch` (and its ``launch_from_*`` variants) fills it once per process;
``ember.context`` and ``ember.config`` read it. Code that works with or without a launch
(``ember.initialize`` in a plain single-process script) calls :func:`get_context` with
``default=True`` to get a single-process context that is not stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ember.errors import ContextError

if TYPE_CHECKING:
    from ember.config import Config


@dataclass(frozen=True)
class Context:
    """Where this process stands in the job.

    Attributes:
        rank: global rank of this process (0 … world_size-1).
        local_rank: rank among the processes of this machine.
        world_size: number of processes in the job.
        device: the device this process computes on (``cuda:<local_rank>`` or ``cpu``).
        seed: the base seed; each rank seeds its generators with ``seed + rank``.
        config: the validated job config.
        backend: the ``torch.distributed`` backend, or None when no process group exists.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 1024
    config: Config | None = None
    backend: str | None = None

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0: the process that writes logs, runs and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1


_CONTEXT: Context | None = None


def default_device() -> torch.device:
    """The device a single process uses when nothing else is said: CUDA if present, else CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def get_context(default: bool = False) -> Context:
    """Return the launched context.

    Args:
        default: when nothing was launched, return a single-process context instead of raising.

    Raises:
        ContextError: nothing was launched and ``default`` is False.
    """
    if _CONTEXT is not None:
        return _CONTEXT
    if default:
        from ember.config import load_config

        return Context(device=default_device(), config=load_config(None))
    raise ContextError(
        "ember's context was read before launch: call ember.launch(...), "
        "ember.launch_from_torch(config=...) or another launch_from_* function first"
    )


def is_launched() -> bool:
    """True once a launch function has set up the context in this process."""
    return _CONTEXT is not None


def ensure_not_launched() -> None:
    """Raise ContextError when this process was launched already."""
    if _CONTEXT is not None:
        raise ContextError(
            "ember was launched twice in this process: launch once at the start of the script "
            "(call ember.context.reset() first if you really mean to start over)"
        )


def set_context(ctx: Context) -> None:
    """Install ``ctx`` as this process's context (used by the launch functions)."""
    global _CONTEXT
    ensure_not_launched()
    _CONTEXT = ctx


def reset() -> None:
    """Forget the context and destroy the process group ember created (tests, notebooks)."""
    global _CONTEXT
    if _CONTEXT is not None and _CONTEXT.backend is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _CONTEXT = None


_FIELDS = frozenset({"rank", "local_rank", "world_size", "device", "seed", "config", "backend",
                     "is_main_process", "is_distributed"})  # fmt: skip


def __getattr__(name: str) -> object:
    # ``ember.context.rank`` and friends read the launched context (PEP 562 module attribute).
    if name in _FIELDS:
        return getattr(get_context(), name)
    raise AttributeError(f"module 'ember.context' has no attribute {name!r}")
