"""The global context: who this process is in the job, on which device, with which config.

:func:`ember.launch` (and its ``launch_from_*`` variants) fills it once per process;
``ember.context`` and ``ember.config`` read it. Code that works with or without a launch
(``ember.initialize`` in a plain single-process script) calls :func:`get_context` with
``default=True`` to get a single-process context that is not stored.

The job's processes form a grid, the :class:`ParallelLayout`: ``pipeline × data × tensor``
(tensor innermost, so the ranks of one tensor-parallel group are neighbours). With more than
one process the launch builds one :class:`~torch.distributed.device_mesh.DeviceMesh` over that
grid with the dimension names :data:`MESH_DIMS`; ``ember.context.coords`` is this rank's
position in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ember.errors import ConfigError, ContextError, LaunchError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ember.config import Config

MESH_DIMS = ("pipeline", "data", "tensor")
"""The DeviceMesh's dimension names, outermost first (ranks ``(p * data + d) * tensor + t``)."""


@dataclass(frozen=True)
class ParallelLayout:
    """How many ranks each kind of parallelism spans; their product is the world size.

    Attributes:
        pipeline: pipeline stages (``parallel.pipeline.size``).
        data: data-parallel replicas (``parallel.data``; ZeRO/FSDP shard over this dimension).
        tensor: tensor-parallel ranks (``parallel.tensor.size``); they see the same batches.

    Example:
        >>> layout = ParallelLayout.from_config({"tensor": 2}, world_size=4)
        >>> layout, layout.coords(3)
        (ParallelLayout(pipeline=1, data=2, tensor=2), {'pipeline': 0, 'data': 1, 'tensor': 1})
    """

    pipeline: int = 1
    data: int = 1
    tensor: int = 1

    @property
    def world_size(self) -> int:
        """The number of processes the layout needs."""
        return self.pipeline * self.data * self.tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        """The mesh shape, in the order of :data:`MESH_DIMS`."""
        return (self.pipeline, self.data, self.tensor)

    def coords(self, rank: int) -> dict[str, int]:
        """The position of global ``rank`` in the grid, e.g. ``{"pipeline": 0, "data": 1, "tensor": 0}``."""
        if not 0 <= rank < self.world_size:
            raise LaunchError(f"rank {rank} is outside the {self.world_size} ranks of {self}")
        rest, t = divmod(rank, self.tensor)
        p, d = divmod(rest, self.data)
        return {"pipeline": p, "data": d, "tensor": t}

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Create the DeviceMesh over the default process group (a collective: every rank calls it)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)

    @classmethod
    def from_config(cls, parallel: Mapping[str, Any] | None, world_size: int) -> ParallelLayout:
        """The layout that the config's ``parallel`` section asks for, checked against the world.

        ``parallel.data`` left unset fills what the tensor and pipeline sizes leave over.

        Raises:
            ConfigError: the sizes do not multiply to ``world_size``; the message lists the
                layouts that do.
        """
        parallel = parallel or {}
        tensor = _size(parallel.get("tensor"))
        pipeline = _size(parallel.get("pipeline"))
        data = parallel.get("data")
        inner = tensor * pipeline
        if data is None and world_size % inner == 0:
            return cls(pipeline=pipeline, data=world_size // inner, tensor=tensor)
        if data is not None and data * inner == world_size:
            return cls(pipeline=pipeline, data=data, tensor=tensor)
        asked = f"parallel.data={'unset' if data is None else data} × parallel.tensor.size={tensor} × "
        asked += f"parallel.pipeline.size={pipeline}"
        raise ConfigError(
            f"config {asked} does not fit the job's {world_size} process(es): data × tensor × pipeline "
            f"must equal {world_size}. Sizes that fit: {_factorizations(world_size)} (or launch "
            f"{(data or 1) * inner} processes)"
        )


def _size(section: Any) -> int:
    if section is None:
        return 1
    if isinstance(section, Mapping):
        return int(section.get("size") or 1)
    return int(section)


def _factorizations(world_size: int, limit: int = 12) -> str:
    """``"data=4; data=2 tensor=2; ..."`` for every (data, tensor, pipeline) with that product."""
    fits = [
        (d, t, world_size // (d * t))
        for t in range(1, world_size + 1)
        for d in range(world_size, 0, -1)
        if world_size % (d * t) == 0
    ]
    fits.sort(key=lambda f: (f[2], f[1]))
    shown = [f"data={d} tensor={t} pipeline={p}" for d, t, p in fits[:limit]]
    return "; ".join(shown) + ("; ..." if len(fits) > limit else "")


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
        """This rank's position in the grid: ``{"pipeline": p, "data": d, "tensor": t}``."""
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

    Building a mesh is a collective, so every rank must ask for the same layout at the same
    point (``ember.initialize`` with the same config on every rank does). None in one process.
    """
    ctx = get_context(default=True)
    if layout.world_size != ctx.world_size:
        raise LaunchError(f"{layout} needs {layout.world_size} processes, but the job has {ctx.world_size}")
    if ctx.world_size == 1:
        return None
    if layout == ctx.layout and ctx.mesh is not None:
        return ctx.mesh
    if layout not in _MESHES:
        _MESHES[layout] = layout.build_mesh(ctx.device.type)
    return _MESHES[layout]


def reset() -> None:
    """Forget the context and destroy the process group ember created (tests, notebooks)."""
    global _CONTEXT
    _MESHES.clear()
    if _CONTEXT is not None and _CONTEXT.backend is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if _CONTEXT is not None:
        from ember.config import set_launched

        set_launched(None)
    _CONTEXT = None


_FIELDS = frozenset({"rank", "local_rank", "world_size", "device", "seed", "config", "backend",
                     "is_main_process", "is_distributed", "layout", "mesh", "coords",
                     "data_parallel_rank", "data_parallel_size"})  # fmt: skip


def __getattr__(name: str) -> object:
    # ``ember.context.rank`` and friends read the launched context (PEP 562 module attribute).
    if name in _FIELDS:
        return getattr(get_context(), name)
    raise AttributeError(f"module 'ember.context' has no attribute {name!r}")
