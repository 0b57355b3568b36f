"""Colossal-AI's ``colossalai.core``: ``global_context`` (``gpc``), read from ember's context.

``gpc.config`` is the launched config; ranks and sizes come from the launched
:mod:`ember.context` and its ``("pipeline", "data", "tensor")`` mesh. Colossal-AI's "local
rank" of a mode is this process's rank *inside that mode's group* (``get_local_rank(DATA)`` is
the data-parallel rank), not its index on the machine (``ember.context.local_rank``).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ember import context as _context
from ember.config import Config
from ember.errors import ContextError

from .context import ParallelMode

__all__ = ["ParallelContext", "global_context"]

# The modes ember's mesh has; the others (2-D/2.5-D/3-D tensor) it never initialises.
_MESH_DIM = {ParallelMode.DATA: "data", ParallelMode.PIPELINE: "pipeline", ParallelMode.TENSOR: "tensor",
             ParallelMode.PARALLEL_1D: "tensor"}  # fmt: skip
# Sequence parallelism (tensor=dict(mode="sequence") is ember's parallel.context): the context
# group, and the data × context group its gradients are averaged over (ember.layout).
_SEQUENCE_GROUP = {ParallelMode.SEQUENCE: "context", ParallelMode.SEQUENCE_DP: "data_context"}


class ParallelContext:
    """Colossal-AI's global context on ember's: the config, and ranks and sizes per parallel mode.

    Every method reads the launched :mod:`ember.context`, so it is right after
    ``launch_from_torch`` in every process; before a launch they raise ``ContextError``
    (``is_initialized`` returns False).

    Example:
        >>> from ember.compat.colossalai.core import global_context as gpc
        >>> gpc.config.BATCH_SIZE, gpc.get_global_rank(), gpc.get_world_size(ParallelMode.DATA)
    """

    def __init__(self) -> None:
        self.verbose = False

    @property
    def config(self) -> Config:
        """The launched config (``gpc.config.NUM_EPOCHS`` reads the file's ``NUM_EPOCHS``)."""
        config = _launched().config
        return config if config is not None else Config()

    def get_global_rank(self) -> int:
        """This process's rank in the whole job."""
        return _launched().rank

    def get_local_rank(self, parallel_mode: ParallelMode) -> int:
        """This process's rank inside the group of ``parallel_mode`` (``ParallelMode.DATA``: its
        data-parallel rank)."""
        return _rank_and_size(parallel_mode)[0]

    def get_world_size(self, parallel_mode: ParallelMode) -> int:
        """How many processes the group of ``parallel_mode`` has."""
        return _rank_and_size(parallel_mode)[1]

    def is_initialized(self, parallel_mode: ParallelMode) -> bool:
        """Whether ``parallel_mode``'s group exists: after a launch, the whole job, data,
        pipeline, tensor and model groups (size 1 when unused) do; the 1-D tensor group when
        tensor parallelism is on; ember has no other."""
        mode = ParallelMode.of(parallel_mode)
        if not _context.is_launched():
            return False
        if mode is ParallelMode.PARALLEL_1D:
            return _launched().layout.tensor > 1
        if mode in _SEQUENCE_GROUP:
            return _launched().layout.context > 1
        return mode in _MESH_DIM or mode in (ParallelMode.GLOBAL, ParallelMode.MODEL)

    def is_first_rank(self, parallel_mode: ParallelMode) -> bool:
        """Whether this process is rank 0 of ``parallel_mode``'s group."""
        return self.get_local_rank(parallel_mode) == 0

    def is_last_rank(self, parallel_mode: ParallelMode) -> bool:
        """Whether this process is the last rank of ``parallel_mode``'s group."""
        rank, size = _rank_and_size(parallel_mode)
        return rank == size - 1

    def get_group(self, parallel_mode: ParallelMode) -> Any:
        """The ``torch.distributed`` process group of ``parallel_mode`` (None with one process).

        Raises:
            ContextError: ``MODEL`` (ember's mesh has no pipeline × tensor group of its own) or a
                mode ember does not run.
        """
        mode = ParallelMode.of(parallel_mode)
        ctx = _launched()
        if ctx.mesh is None:
            return None
        if mode is ParallelMode.GLOBAL:
            return dist.group.WORLD
        if mode in _SEQUENCE_GROUP:
            _rank_and_size(mode)  # not initialised without sequence parallelism: say so
            return _context.get_group(_SEQUENCE_GROUP[mode])
        if mode not in _MESH_DIM:
            raise ContextError(
                f"ember has no process group for {mode}: it has GLOBAL, DATA, PIPELINE, TENSOR and (with sequence "
                "parallelism) SEQUENCE, SEQUENCE_DP"
            )
        return ctx.mesh[_MESH_DIM[mode]].get_group()

    def destroy(self) -> None:
        """End the job's process group and forget the launch (``ember.context.reset()``), as
        Colossal-AI's ``gpc.destroy()`` at a program's end; nothing happens when not launched."""
        _context.reset()

    @property
    def data_parallel_size(self) -> int:
        """The number of data-parallel replicas."""
        return _launched().layout.data

    @property
    def pipeline_parallel_size(self) -> int:
        """The number of pipeline stages."""
        return _launched().layout.pipeline

    @property
    def tensor_parallel_size(self) -> int:
        """The tensor-parallel size."""
        return _launched().layout.tensor


def _launched() -> _context.Context:
    if not _context.is_launched():
        raise ContextError(
            "gpc was read before a launch: call colossalai.launch_from_torch(config=...) (or another launch "
            "function) first"
        )
    return _context.get_context()


def _rank_and_size(parallel_mode: Any) -> tuple[int, int]:
    mode = ParallelMode.of(parallel_mode)
    ctx = _launched()
    if mode is ParallelMode.GLOBAL:
        return ctx.rank, ctx.world_size
    layout, coords = ctx.layout, ctx.coords
    if mode is ParallelMode.MODEL:  # the pipeline × tensor block this rank's model is split over
        return coords["pipeline"] * layout.tensor + coords["tensor"], layout.pipeline * layout.tensor
    if mode is ParallelMode.PARALLEL_1D and layout.tensor == 1:
        raise ContextError("ParallelMode.PARALLEL_1D is not initialised: set parallel=dict(tensor=dict(size=N))")
    if mode in _SEQUENCE_GROUP:
        if layout.context == 1:
            raise ContextError(
                f"{mode} is not initialised: set parallel=dict(tensor=dict(size=N, mode='sequence')) "
                "(ember's parallel.context=N)"
            )
        return coords[_SEQUENCE_GROUP[mode]], layout.size(_SEQUENCE_GROUP[mode])
    if mode not in _MESH_DIM:
        raise ContextError(
            f"ember has no {mode} group (it runs data, pipeline and 1-D tensor parallelism): use ParallelMode.GLOBAL, "
            "DATA, PIPELINE, TENSOR, MODEL or PARALLEL_1D"
        )
    dim = _MESH_DIM[mode]
    return coords[dim], getattr(layout, dim)


global_context = ParallelContext()
"""The one global context: ``from ember.compat.colossalai.core import global_context as gpc``."""
