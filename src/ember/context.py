"""The global context: who this process is in the job, on which device, with which config.

:func:`ember.launch` (and its ``launch_from_*`` variants) fills it once per process;
``ember.context`` and ``ember.config`` read it. Code that works with or without a launch
(``ember.initialize`` in a plain single-process script) calls :func:`get_context` with
``default=True`` to get a single-process context that is not stored.

The job's processes form a grid, the :class:`~ember.layout.ParallelLayout`:
``pipeline × data × context × tensor`` (tensor innermost, so the ranks of one tensor-parallel
group are neighbours). With more than one process the launch builds one
:class:`~torch.distributed.device_mesh.DeviceMesh` over that grid with the dimension names
:data:`~ember.layout.MESH_DIMS`, and the process groups of the sub-dimensions that the tensor
modes and expert parallelism split it into; ``ember.context.coords`` is this rank's position in
every group, :func:`get_group` its process group.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ember.errors import ContextError, LaunchError
from ember.layout import MESH_DIMS as MESH_DIMS
from ember.layout import ParallelLayout, build_groups

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

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
        layout: the pipeline × data × tensor grid of the launched config.
        mesh: the DeviceMesh over that grid (dims :data:`MESH_DIMS`), or None in a
            single-process job.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 1024
    config: Config | None = None
    backend: str | None = None
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    mesh: DeviceMesh | None = None

    @property
    def coords(self) -> dict[str, int]:
        """This rank's position in the grid: ``{"pipeline": p, "data": d, "context": c, "tensor": t}``,
        plus its place in each sub-dimension of the layout (``"tensor_row"``, ``"expert"``, ...)."""
        return self.layout.coords(self.rank)

    @property
    def data_parallel_rank(self) -> int:
        """This rank's index among the data-parallel replicas: what the data sampler shards by."""
        return self.coords["data"]

    @property
    def data_parallel_size(self) -> int:
        """The number of data-parallel replicas (world size / (tensor × pipeline))."""
        return self.layout.data

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0: the process that writes logs, runs and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when the job has more than one process."""
        return self.world_size > 1


_CONTEXT: Context | None = None
_MESHES: dict[ParallelLayout, DeviceMesh] = {}
_GROUPS: dict[ParallelLayout, dict[str, ProcessGroup]] = {}


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
    from ember.config import Config, set_launched  # here: ``import ember.context`` stays light

    set_launched(ctx.config if ctx.config is not None else Config())
    _CONTEXT = ctx


def get_mesh(layout: ParallelLayout) -> DeviceMesh | None:
    """The DeviceMesh for ``layout``: the launched one, or one built (once) for a per-Engine layout.

    The layout's process groups (:func:`get_group`) are created with it. Building a mesh is a
    collective, so every rank must ask for the same layout at the same point (the launch does
    for the launched layout; ``ember.initialize`` with the same config on every rank for its
    own). None in one process.
    """
    ctx = get_context(default=True)
    if layout.world_size != ctx.world_size:
        raise LaunchError(f"{layout} needs {layout.world_size} processes, but the job has {ctx.world_size}")
    if ctx.world_size == 1:
        return None
    if layout == ctx.layout and ctx.mesh is not None:
        mesh = ctx.mesh
    else:
        if layout not in _MESHES:
            _MESHES[layout] = layout.build_mesh(ctx.device.type)
        mesh = _MESHES[layout]
    if layout not in _GROUPS:
        _GROUPS[layout] = build_groups(layout, mesh)
    return mesh


def get_group(name: str, layout: ParallelLayout | None = None) -> ProcessGroup | None:
    """This rank's process group ``name`` of the launched layout (or of ``layout``).

    ``name`` is a mesh dim (``"data"``, ``"tensor"``, ...), a sub-dimension (``"tensor_row"``,
    ``"expert"``, ...) or a combined group (``"tensor_xz"``); see :mod:`ember.layout`.

    Returns:
        The group, or None when it has one rank (nothing to communicate) or the job has one process.

    Raises:
        LaunchError: the layout has no such group (the message lists those it has).

    Example:
        >>> row = ember.context.get_group("tensor_row")   # parallel.tensor = dict(size=4, mode="2d")
    """
    layout = layout or get_context(default=True).layout
    layout.size(name)  # an unknown name fails here, the same on every rank
    get_mesh(layout)
    return _GROUPS.get(layout, {}).get(name)


def reset() -> None:
    """Forget the context and destroy the process group ember created (tests, notebooks)."""
    global _CONTEXT
    ended, _CONTEXT = _CONTEXT, None
    created_group = ended is not None and ended.backend is not None
    ended = None
    _MESHES.clear()
    _GROUPS.clear()
    from ember.config import set_launched

    set_launched(None)
    if created_group:
        # What the ending job built (a DDP's reducer, a mesh) may sit in reference cycles that hold
        # its process groups. Collected here, their gloo groups are destroyed while gloo's threads
        # run; left as garbage, a process forked later (a DataLoader worker) may collect them, and
        # a gloo group destroyed there waits forever for threads that process does not have. Only
        # then: a full collection costs 0.1-0.2 s in a process that imported torch.
        gc.collect()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


_FIELDS = frozenset({"rank", "local_rank", "world_size", "device", "seed", "config", "backend",
                     "is_main_process", "is_distributed", "layout", "mesh", "coords",
                     "data_parallel_rank", "data_parallel_size"})  # fmt: skip


def __getattr__(name: str) -> object:
    # ``ember.context.rank`` and friends read the launched context (PEP 562 module attribute).
    if name in _FIELDS:
        return getattr(get_context(), name)
    raise AttributeError(f"module 'ember.context' has no attribute {name!r}")
