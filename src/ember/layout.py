"""The job's grid of processes: how many ranks each kind of parallelism spans, and its groups.

The grid is ``pipeline × data × context × tensor`` (tensor innermost, so the ranks of one
tensor-parallel group are neighbours; context next, so a sequence is split over neighbours too):

    rank = ((p · D + d) · C + c) · T + t

Two kinds of parallelism split a dimension further into *sub-dimensions*:

* the multi-dimensional tensor modes split ``tensor`` (``parallel.tensor.mode``):

  =======  ==============  ===============================================================
  mode     tensor size     sub-dimensions, outermost first (``t`` is their row-major index)
  =======  ==============  ===============================================================
  ``1d``   any T           none
  ``2d``   q²              ``tensor_col`` (q), ``tensor_row`` (q)
  ``2.5d`` d · q²          ``tensor_dep`` (d), ``tensor_col`` (q), ``tensor_row`` (q)
  ``3d``   q³              ``tensor_output`` (q), ``tensor_weight`` (q), ``tensor_input`` (q)
  =======  ==============  ===============================================================

* expert parallelism splits ``data``: ``expert_data`` (D / E) outermost, ``expert`` (E)
  innermost, so the E ranks that exchange tokens hold consecutive data coordinates.

Every dimension, coarse or fine, names a group: the ranks that differ only in that coordinate
(as ``DeviceMesh`` dims do). So the ``tensor_row`` group is one row of the q × q grid, and a
rank's ``tensor_row`` coordinate is its place in that row (its column). A few modes also need a
group over two sub-dimensions at once (:data:`COMBINED`), and context parallelism one over data ×
context (:data:`CONTEXT_COMBINED`). :func:`build_groups` creates them all;
``ember.context.get_group(name)`` returns this rank's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ember.errors import ConfigError, LaunchError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

MESH_DIMS = ("pipeline", "data", "context", "tensor")
"""The DeviceMesh's dimension names, outermost first (ranks ``((p * D + d) * C + c) * T + t``)."""

TENSOR_MODES = ("1d", "2d", "2.5d", "3d")
"""The values of ``parallel.tensor.mode``."""

TENSOR_SUB_DIMS: dict[str, tuple[str, ...]] = {
    "1d": (),
    "2d": ("tensor_col", "tensor_row"),
    "2.5d": ("tensor_dep", "tensor_col", "tensor_row"),
    "3d": ("tensor_output", "tensor_weight", "tensor_input"),
}
"""Each tensor mode's sub-dimensions of ``tensor``, outermost first."""

EXPERT_SUB_DIMS = ("expert_data", "expert")
"""The sub-dimensions of ``data`` under expert parallelism, outermost first."""

COMBINED: dict[str, dict[str, tuple[str, ...]]] = {
    "2.5d": {"tensor_xz": ("tensor_dep", "tensor_row")},
    "3d": {
        "tensor_input_x_weight": ("tensor_weight", "tensor_input"),
        "tensor_output_x_weight": ("tensor_output", "tensor_weight"),
    },
}
"""Groups over two sub-dimensions at once, per tensor mode: name -> the sub-dimensions it spans."""

CONTEXT_COMBINED: dict[str, tuple[str, ...]] = {"data_context": ("data", "context")}
"""Groups that exist under context parallelism (``context`` > 1): name -> the dims it spans.
``data_context`` holds the ranks whose parameters are replicas of each other (gradients are
averaged over it; Colossal-AI's ``SEQUENCE_DP``)."""


@dataclass(frozen=True)
class ParallelLayout:
    """How many ranks each kind of parallelism spans; ``pipeline × data × context × tensor`` is the world.

    Attributes:
        pipeline: pipeline stages (``parallel.pipeline.size``).
        data: data-parallel replicas (``parallel.data``; ZeRO/FSDP shard over this dimension).
        tensor: tensor-parallel ranks (``parallel.tensor.size``); they see the same batches.
        context: context-parallel ranks (``parallel.context``): each holds a slice of every
            sequence of the same batches.
        expert: expert-parallel ranks (``parallel.expert``), a split of ``data``: the ranks that
            hold different experts and exchange tokens.
        tensor_mode: ``"1d"``, ``"2d"``, ``"2.5d"`` or ``"3d"`` (``parallel.tensor.mode``).
        tensor_depth: the 2.5-D mode's depth d (``parallel.tensor.depth``); 1 otherwise.

    Example:
        >>> layout = ParallelLayout.from_config({"tensor": 2}, world_size=4)
        >>> layout, layout.coords(3)["data"], layout.coords(3)["tensor"]
        (ParallelLayout(pipeline=1, data=2, tensor=2), 1, 1)
        >>> ParallelLayout.from_config({"tensor": dict(size=4, mode="2d")}, 4).coords(2)["tensor_col"]
        1
    """

    pipeline: int = 1
    data: int = 1
    tensor: int = 1
    context: int = 1
    expert: int = 1
    tensor_mode: str = "1d"
    tensor_depth: int = 1

    def __repr__(self) -> str:  # the fields left at their defaults say nothing
        shown = [f"pipeline={self.pipeline}", f"data={self.data}", f"tensor={self.tensor}"]
        shown += [f"{name}={value!r}" for name, value, default in self._extras() if value != default]
        return f"ParallelLayout({', '.join(shown)})"

    def _extras(self) -> tuple[tuple[str, Any, Any], ...]:
        return (
            ("context", self.context, 1),
            ("expert", self.expert, 1),
            ("tensor_mode", self.tensor_mode, "1d"),
            ("tensor_depth", self.tensor_depth, 1),
        )

    @property
    def world_size(self) -> int:
        """The number of processes the layout needs."""
        return self.pipeline * self.data * self.context * self.tensor

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The mesh shape, in the order of :data:`MESH_DIMS`."""
        return (self.pipeline, self.data, self.context, self.tensor)

    @property
    def fine_dims(self) -> tuple[tuple[str, int], ...]:
        """The grid at its finest: ``(name, size)`` outermost first, sub-dimensions in place of the
        dimension they split (``data`` under expert parallelism, ``tensor`` under 2/2.5/3-D)."""
        dims: list[tuple[str, int]] = [("pipeline", self.pipeline)]
        dims += [("expert_data", self.data // self.expert), ("expert", self.expert)] if self.expert > 1 else []
        dims += [("data", self.data)] if self.expert == 1 else []
        dims.append(("context", self.context))
        dims += list(zip(TENSOR_SUB_DIMS[self.tensor_mode], self._tensor_sub_sizes(), strict=True)) or [
            ("tensor", self.tensor)
        ]
        return tuple(dims)

    def _tensor_sub_sizes(self) -> tuple[int, ...]:
        q = _root(self.tensor // self.tensor_depth, 3 if self.tensor_mode == "3d" else 2)
        return {"1d": (), "2d": (q, q), "2.5d": (self.tensor_depth, q, q), "3d": (q, q, q)}[self.tensor_mode]

    @property
    def group_names(self) -> dict[str, tuple[str, ...]]:
        """Every group's name -> the fine dimensions it spans: the mesh dims, the sub-dimensions and
        the combined groups of the tensor mode."""
        fine = [name for name, _ in self.fine_dims]
        groups: dict[str, tuple[str, ...]] = {name: (name,) for name in fine}
        groups["data"] = EXPERT_SUB_DIMS if self.expert > 1 else ("data",)
        groups["tensor"] = TENSOR_SUB_DIMS[self.tensor_mode] or ("tensor",)
        groups.update(COMBINED.get(self.tensor_mode, {}))
        if self.context > 1:
            groups.update({name: sum((groups[d] for d in dims), ()) for name, dims in CONTEXT_COMBINED.items()})
        order = {name: i for i, name in enumerate(MESH_DIMS)}
        return {name: groups[name] for name in sorted(groups, key=lambda n: (order.get(n, len(order)), n))}

    def size(self, name: str) -> int:
        """The number of ranks in a ``name`` group (e.g. ``"tensor_row"`` is q under ``2d``).

        Raises:
            LaunchError: the layout has no such group (the message lists those it has).
        """
        sizes = dict(self.fine_dims)
        return math.prod(sizes[dim] for dim in self._spans(name))

    def coords(self, rank: int) -> dict[str, int]:
        """The position of global ``rank``: its place in every group of :attr:`group_names`.

        Always holds ``pipeline``, ``data``, ``context`` and ``tensor``; the sub-dimensions and
        combined groups of the layout's tensor mode and expert split when it has them.
        """
        if not 0 <= rank < self.world_size:
            raise LaunchError(f"rank {rank} is outside the {self.world_size} ranks of {self}")
        fine: dict[str, int] = {}
        rest = rank
        for name, size in reversed(self.fine_dims):
            rest, fine[name] = divmod(rest, size)
        return {name: self._index(fine, spans) for name, spans in self.group_names.items()}

    def group_ranks(self, name: str) -> list[list[int]]:
        """Every ``name`` group of the job, each as its global ranks in the group's own order."""
        spans = self._spans(name)
        dims = self.fine_dims
        outside = [range(size) if dim not in spans else range(1) for dim, size in dims]
        inside = [range(size) if dim in spans else range(1) for dim, size in dims]
        groups = []
        for base in itertools.product(*outside):
            members = [
                _ravel([b + i for b, i in zip(base, offset, strict=True)], [s for _, s in dims])
                for offset in itertools.product(*inside)
            ]
            groups.append(members)
        return groups

    def _spans(self, name: str) -> tuple[str, ...]:
        names = self.group_names
        if name not in names:
            raise LaunchError(f"{self} has no {name!r} group; its groups are {', '.join(names)}")
        return names[name]

    def _index(self, fine: Mapping[str, int], spans: tuple[str, ...]) -> int:
        sizes = dict(self.fine_dims)
        return _ravel([fine[dim] for dim in spans], [sizes[dim] for dim in spans])

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """Create the DeviceMesh over the default process group (a collective: every rank calls it)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)

    @classmethod
    def from_config(cls, parallel: Mapping[str, Any] | None, world_size: int) -> ParallelLayout:
        """The layout that the config's ``parallel`` section asks for, checked against the world.

        ``parallel.data`` left unset fills what the tensor, context and pipeline sizes leave over.

        Raises:
            ConfigError: the sizes do not multiply to ``world_size`` (the message lists the
                layouts that do); a tensor size that does not fit its mode (2-D: q², 2.5-D: d·q²,
                3-D: q³; the message lists the sizes that do); an expert size that does not
                divide the data size.
        """
        parallel = parallel or {}
        tensor_section = parallel.get("tensor")
        tensor = _size(tensor_section)
        mode, depth = _tensor_mode(tensor_section, tensor)
        pipeline = _size(parallel.get("pipeline"))
        context = _size(parallel.get("context"))
        data = parallel.get("data")
        inner = tensor * pipeline * context
        if data is None and world_size % inner == 0:
            data = world_size // inner
        elif data is None or data * inner != world_size:
            asked = f"parallel.data={'unset' if data is None else data} × parallel.tensor.size={tensor} × "
            asked += f"parallel.pipeline.size={pipeline}" + f" × parallel.context={context}" * (context > 1)
            raise ConfigError(
                f"config {asked} does not fit the job's {world_size} process(es): their product must equal "
                f"{world_size}. Sizes that fit: {_factorizations(world_size // context)}"
                + f" (with parallel.context={context})" * (context > 1)
                + f" (or launch {(data or 1) * inner} processes)"
            )
        expert = int(parallel.get("expert") or 1)
        if data % expert:
            fits = [e for e in range(1, data + 1) if data % e == 0]
            raise ConfigError(
                f"config parallel.expert={expert} does not divide the {data} data-parallel replicas (expert "
                f"parallelism splits the data dimension): use one of {fits}, or change parallel.data"
            )
        return cls(pipeline, data, tensor, context, expert, mode, depth)


def build_groups(layout: ParallelLayout, mesh: DeviceMesh | None) -> dict[str, ProcessGroup]:
    """This rank's process group of every group of ``layout`` (a collective: every rank calls it).

    The mesh dims' groups are the mesh's; the sub-dimensions and combined groups are created
    here, every rank creating every group in the same order. Groups of one rank are left out.
    """
    import torch.distributed as dist

    if mesh is None:
        return {}
    groups: dict[str, ProcessGroup] = {}
    for name in layout.group_names:
        if layout.size(name) == 1:
            continue
        if name in MESH_DIMS:
            groups[name] = mesh[name].get_group()
        else:
            mine, _ = dist.new_subgroups_by_enumeration(layout.group_ranks(name))
            groups[name] = mine
    return groups


def _tensor_mode(section: Any, tensor: int) -> tuple[str, int]:
    """``(mode, depth)`` of the ``parallel.tensor`` section, checked against its size."""
    mode = (section.get("mode") if isinstance(section, Mapping) else None) or "1d"
    depth = section.get("depth") if isinstance(section, Mapping) else None
    mode = str(mode).lower()
    if mode not in TENSOR_MODES:
        raise ConfigError(f"config parallel.tensor.mode={mode!r}; allowed: {', '.join(map(repr, TENSOR_MODES))}")
    if depth is not None and mode != "2.5d":
        raise ConfigError(
            f"config parallel.tensor.depth={depth} applies to mode='2.5d' only (tensor size = depth × q²); "
            f"remove it for mode={mode!r}"
        )
    if mode == "2.5d" and depth is None:
        raise ConfigError(
            "config parallel.tensor.mode='2.5d' needs parallel.tensor.depth=d (the size is d × q²: "
            "e.g. size=8, depth=2)"
        )
    depth = int(depth or 1)
    power = 3 if mode == "3d" else 2
    fits = mode == "1d" or (tensor % depth == 0 and _root(tensor // depth, power) ** power == tensor // depth)
    if not fits:
        shape = {"2d": "q × q", "2.5d": f"depth × q × q = {depth} × q²", "3d": "q × q × q"}[mode]
        sizes = [depth * q**power for q in range(1, 5)]
        raise ConfigError(
            f"config parallel.tensor.size={tensor} does not fit mode={mode!r}, which needs {shape} ranks: "
            f"sizes that fit are {', '.join(map(str, sizes))}, ..."
        )
    return mode, depth


def _root(n: int, power: int) -> int:
    """The integer ``power``-th root of ``n`` when it has one, else its floor."""
    root = round(n ** (1 / power))
    return next((r for r in (root - 1, root, root + 1) if r >= 0 and r**power == n), int(n ** (1 / power)))


def _ravel(index: list[int], sizes: list[int]) -> int:
    flat = 0
    for i, size in zip(index, sizes, strict=True):
        flat = flat * size + i
    return flat


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
