"""The grid of a multi-dimensional tensor mode, and the parameter shards that live on it.

Under ``parallel.tensor.mode`` ``"2d"``, ``"2.5d"`` or ``"3d"`` the ranks of one tensor-parallel
group form a grid whose axes are the mode's sub-dimensions (:data:`ember.layout.TENSOR_SUB_DIMS`):
``(tensor_col, tensor_row)`` of q × q, ``(tensor_dep, tensor_col, tensor_row)`` of d × q × q,
``(tensor_output, tensor_input, tensor_weight)`` of q × q × q (under ``"1d"``, the one axis
``tensor``, for :mod:`ember.parallel.tensor1d`'s layers). A :class:`TensorGrid` is this
rank's place on it: its coordinate and process group along every axis (and the combined
groups), for the launched layout (:func:`launched_grid`) or a per-Engine one (:func:`grid_of`).

The layers of :mod:`ember.parallel.tensor2d`, :mod:`~ember.parallel.tensor2p5d` and
:mod:`~ember.parallel.tensor3d` hold their parameters as plain tensors: this rank's *shard*.
A :class:`ShardSpec` says how a shard relates to the whole tensor — for each axis, the tensor
dimension it is split along, or ``None`` when every rank along that axis holds the same block
(replicated); splits along the same tensor dimension nest outermost axis first, as
DTensor's placements do. With it :class:`GridLayer` makes ``state_dict()`` give whole tensors
(gathered from the shards: a collective over the tensor group) and ``load_state_dict()`` take
whole tensors (each rank cuts its own block: no communication), so one set of weights moves
between modes, layouts and one process. Inside :func:`local_shards` the state dict holds the
shards instead, as DTensors over :meth:`TensorGrid.mesh`, which is what
``torch.distributed.checkpoint`` saves, and reshards into any other layout on load.

Parameters are drawn whole on the CPU from a generator seeded by the config's ``seed`` and the
parameter's index on its grid (:meth:`TensorGrid.init_full`), then cut to the shard: every rank
of every layout builds the same model, without communicating.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ember import context as _context
from ember.errors import CheckpointError, ConfigError
from ember.layout import COMBINED, TENSOR_SUB_DIMS, ParallelLayout

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "GridLayer",
    "ShardSpec",
    "TensorGrid",
    "grid_of",
    "launched_grid",
    "local_shards",
    "shard_specs",
]

GRID_MODES = ("2d", "2.5d", "3d")
"""The tensor modes whose layers always live on a :class:`TensorGrid`; ``"1d"`` does when the
model is built from :mod:`ember.parallel.tensor1d`'s layers (Colossal-AI's ``Linear1D`` & co.)."""

_LOCAL = contextvars.ContextVar("ember_local_shards", default=False)


class TensorGrid:
    """This rank's place on the tensor-parallel grid of ``layout``, and the groups along its axes.

    Build one with :func:`grid_of` (per layout, cached) or :func:`launched_grid`; layers take it
    as their ``grid`` argument. In a single process (or a one-rank tensor group) every axis has
    size 1 and no group: the layers then compute what plain PyTorch layers compute.

    Args:
        layout: the job's layout.
        seed: the base seed of :meth:`init_full` (the launched config's ``seed``).

    Attributes:
        mode: ``"1d"``, ``"2d"``, ``"2.5d"`` or ``"3d"``.
        layout: the layout.
        axes: the sub-dimensions, outermost first (``("tensor_col", "tensor_row")`` under 2-D;
            ``("tensor",)`` under 1-D).

    Example:
        >>> grid = grid_of(ParallelLayout(tensor=4, tensor_mode="2d"))
        >>> grid.q, grid.coord("tensor_row"), grid.group("tensor_col")
    """

    def __init__(self, layout: ParallelLayout, seed: int = 1024) -> None:
        self.mode = layout.tensor_mode
        self.layout = layout
        self.axes: tuple[str, ...] = TENSOR_SUB_DIMS[self.mode] or ("tensor",)
        self.seed = seed
        ctx = _context.get_context(default=True)
        self.rank = ctx.rank if layout.world_size == ctx.world_size else 0
        self._coords = layout.coords(self.rank)
        self._groups: dict[str, ProcessGroup | None] = {}
        self._mesh: DeviceMesh | None = None
        self._built = 0  # parameters drawn so far (init_full's seed offset)
        self.flipped = False
        """3-D: whether the next layer's input has its roles of input and output swapped (each
        :class:`~ember.parallel.tensor3d.Linear3D` built flips it, as Colossal-AI's do). 1-D:
        whether the next layer's input is split by features (Colossal-AI's ``parallel_input``)."""

    def __repr__(self) -> str:
        shown = " × ".join(f"{axis}={self.size(axis)}" for axis in self.axes)
        return f"TensorGrid({self.mode}: {shown}, rank {self.rank})"

    @property
    def q(self) -> int:
        """The side of the square (2-D, 2.5-D) or cube (3-D)."""
        return self.size(self.axes[-1])

    @property
    def depth(self) -> int:
        """The 2.5-D depth d (1 in the other modes)."""
        return self.size("tensor_dep") if self.mode == "2.5d" else 1

    @property
    def tensor_size(self) -> int:
        """The ranks of the grid (q², d·q² or q³)."""
        return self.layout.tensor

    def size(self, name: str) -> int:
        """The ranks along an axis or combined group ``name``."""
        return self.layout.size(name)

    def coord(self, name: str) -> int:
        """This rank's index along an axis or combined group ``name``."""
        return self._coords[name]

    def group(self, name: str) -> ProcessGroup | None:
        """This rank's process group along ``name`` (None when it has one rank)."""
        if name not in self._groups:
            if name not in self.axes and name not in COMBINED.get(self.mode, {}) and name != "tensor":
                raise ConfigError(f"{self} has no axis {name!r}; its axes are {', '.join(self.axes)}")
            alone = self.size(name) == 1 or _context.get_context(default=True).world_size == 1
            self._groups[name] = None if alone else _context.get_group(name, self.layout)
        return self._groups[name]

    def mesh(self) -> DeviceMesh | None:
        """A DeviceMesh over the axes of more than one rank (this rank's tensor group), built
        from their process groups (no new group): what the shards' DTensor views live on."""
        if self._mesh is None:
            axes = [a for a in self.axes if self.size(a) > 1]
            if not axes or _context.get_context(default=True).world_size == 1:
                return None
            from torch.distributed.device_mesh import DeviceMesh

            mine = next(g for g in self.layout.group_ranks("tensor") if self.rank in g)
            shape = [self.size(a) for a in self.axes]
            ranks = torch.tensor(mine, dtype=torch.int).reshape(shape)
            for i in reversed([i for i, a in enumerate(self.axes) if self.size(a) == 1]):
                ranks = ranks.squeeze(i)
            groups = [self.group(a) for a in axes]
            device = _context.get_context(default=True).device.type
            self._mesh = DeviceMesh.from_group(groups, device, ranks, mesh_dim_names=tuple(axes))  # type: ignore[arg-type]
        return self._mesh

    def init_full(
        self, shape: Sequence[int], init: Callable[[torch.Tensor], Any], dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """A whole tensor of ``shape`` filled by ``init`` from this grid's next seed, on the CPU.

        ``init`` draws from torch's default CPU generator, which is seeded with ``seed +
        index`` (the index of the parameter on this grid) inside :func:`torch.random.fork_rng`:
        the same values on every rank and layout, and the caller's generator is left as it was.
        """
        seed = self.seed + self._built
        self._built += 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            full = torch.empty(tuple(shape), dtype=dtype or torch.get_default_dtype())
            with torch.no_grad():
                init(full)
        return full


_GRIDS: dict[ParallelLayout, tuple[TensorGrid, Any]] = {}
"""layout -> (its grid, a weak reference to the launch it was built under, or None unlaunched)."""


def grid_of(layout: ParallelLayout) -> TensorGrid:
    """The :class:`TensorGrid` of ``layout`` (one per layout and launch, so the layers built on it share it).

    A grid built under an earlier launch (``ember.context.reset()`` and a new launch, in tests and
    notebooks) is not reused: its process groups are gone.
    Its process groups come from :func:`ember.context.get_group` (for a per-Engine layout the
    first use builds its mesh and groups: a collective, every rank in the same order).
    """
    launch = _context.get_context() if _context.is_launched() else None
    cached = _GRIDS.get(layout)
    if cached is None or (cached[1]() if cached[1] is not None else None) is not launch:
        grid = TensorGrid(layout, _context.get_context(default=True).seed)
        _GRIDS[layout] = (grid, weakref.ref(launch) if launch is not None else None)
    return _GRIDS[layout][0]


def launched_grid(mode: str, who: str) -> TensorGrid:
    """The grid of the launched layout, for a layer of ``mode`` built without ``grid=``.

    Args:
        mode: the layer's mode (``"2d"``, ``"2.5d"``, ``"3d"``).
        who: the layer, for the message (``"Linear2D"``).

    Raises:
        ConfigError: nothing was launched, or the launched config's tensor mode is another one.
    """
    if not _context.is_launched():
        raise ConfigError(
            f"{who} was built before ember.launch: launch with parallel=dict(tensor=dict(size=N, mode={mode!r})) "
            f"first (colossalai.launch_from_torch(config=...)), or pass grid=ember.parallel.grid.grid_of(layout)"
        )
    layout = _context.get_context().layout
    if layout.tensor_mode != mode:
        raise ConfigError(
            f"{who} is a {mode} tensor-parallel layer, but the launched config has parallel.tensor.mode="
            f"{layout.tensor_mode!r} (size {layout.tensor}): build the layers of that mode (colossalai.nn.Linear "
            f"and friends pick it for you), or set parallel.tensor.mode={mode!r}"
        )
    return grid_of(layout)


def reset_grids() -> None:
    """Forget the grids (with the process groups they hold); ``ember.context.reset`` territory, for tests."""
    _GRIDS.clear()


@dataclass(frozen=True)
class ShardSpec:
    """How a parameter's local shard relates to the whole tensor on a :class:`TensorGrid`.

    Attributes:
        grid: the grid.
        split: for each axis of ``grid.axes``, the tensor dimension split along it, or None when
            the ranks along that axis hold the same block (replicated). Splits of one dimension
            nest outermost axis first.
        shape: the whole tensor's shape.
    """

    grid: TensorGrid
    split: tuple[int | None, ...]
    shape: torch.Size

    def local_shape(self) -> torch.Size:
        """The shape of this rank's shard."""
        shape = list(self.shape)
        for axis, dim in zip(self.grid.axes, self.split, strict=True):
            if dim is not None:
                shape[dim] //= self.grid.size(axis)
        return torch.Size(shape)

    @property
    def replicas(self) -> int:
        """How many ranks of the tensor group hold each block (the product of the replicated axes)."""
        return math.prod(self.grid.size(a) for a, d in zip(self.grid.axes, self.split, strict=True) if d is None)

    @property
    def is_whole(self) -> bool:
        """True when the shard is the whole tensor (every axis replicated or of size 1)."""
        return all(d is None or self.grid.size(a) == 1 for a, d in zip(self.grid.axes, self.split, strict=True))

    def shard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's block of the whole tensor ``full`` (a view; no communication)."""
        out = full
        for axis, dim in zip(self.grid.axes, self.split, strict=True):
            if dim is not None and self.grid.size(axis) > 1:
                out = out.chunk(self.grid.size(axis), dim=dim)[self.grid.coord(axis)]
        return out

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor from every rank's shard: a collective over the split axes' groups."""
        out = local.detach().contiguous()
        for axis, dim in reversed(list(zip(self.grid.axes, self.split, strict=True))):
            group = self.grid.group(axis)
            if dim is None or group is None:
                continue
            parts = [torch.empty_like(out) for _ in range(self.grid.size(axis))]
            dist.all_gather(parts, out, group=group)
            out = torch.cat(parts, dim=dim)
        return out

    def as_dtensor(self, local: torch.Tensor) -> Any:
        """``local`` as a DTensor view over :meth:`TensorGrid.mesh` (sharing its storage), or
        ``local`` itself when the grid has one rank."""
        mesh = self.grid.mesh()
        if mesh is None:
            return local
        from torch.distributed.tensor import DTensor, Replicate, Shard

        names = mesh.mesh_dim_names or ()
        by_axis = dict(zip(self.grid.axes, self.split, strict=True))
        placements = [Replicate() if by_axis[n] is None else Shard(by_axis[n]) for n in names]  # type: ignore[arg-type]
        stride = torch.empty(self.shape, device="meta").stride()
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=self.shape, stride=stride)


class GridLayer(nn.Module):
    """Base of the grid layers: parameters are this rank's shards, ``state_dict`` whole tensors.

    A subclass registers each sharded parameter with :meth:`shard_parameter`.
    ``state_dict()`` gathers the whole tensors from the shards (a collective over the tensor
    group: every rank calls it) and ``load_state_dict()`` takes whole tensors and keeps this
    rank's block; inside :func:`local_shards` both work on the shards as DTensors instead.
    """

    # What ``ember.parallel.grid_layers``' builders set, by kind of layer (for the type checker).
    weight: nn.Parameter
    bias: nn.Parameter | None
    in_features: int
    out_features: int
    num_classes: int
    normalized_shape: int
    eps: float
    num_embeddings: int
    embedding_dim: int
    padding_idx: int | None
    embed_args: tuple[Any, ...]
    embed_kwargs: dict[str, Any]
    vocab_start: int
    vocab_end: int
    img_size: tuple[int, int]
    patch_size: tuple[int, int]
    num_patches: int
    embed_size: int
    cls_token: nn.Parameter
    pos_embed: nn.Parameter

    def __init__(self, grid: TensorGrid) -> None:
        super().__init__()
        self.grid = grid
        self.shard_specs: dict[str, ShardSpec] = {}
        """The sharded parameters of this layer (not of its children): name -> spec."""

    def shard_parameter(
        self, name: str, shape: Sequence[int], split: Sequence[int | None], init: Callable[[torch.Tensor], Any],
        dtype: torch.dtype | None = None, device: torch.device | None = None,
    ) -> nn.Parameter:  # fmt: skip
        """Create parameter ``name``: the whole ``shape`` drawn by :meth:`TensorGrid.init_full`,
        this rank's block kept.

        Args:
            name: the attribute name.
            shape: the whole tensor's shape.
            split: the tensor dimension split along each axis of the grid, or None (replicated).
            init: fills the whole tensor in place (``torch.nn.init`` style).
            dtype: the parameter's dtype (default: torch's default).
            device: where it lives (default: the launched context's device).

        Raises:
            ConfigError: a split dimension that the axis size does not divide.
        """
        spec = ShardSpec(self.grid, tuple(split), torch.Size(shape))
        parts = [1] * len(shape)  # splits of one dimension nest: they multiply
        for axis, dim in zip(self.grid.axes, spec.split, strict=True):
            if dim is not None:
                parts[dim] *= self.grid.size(axis)
        for dim, count in enumerate(parts):
            if shape[dim] % count:
                raise ConfigError(
                    f"{type(self).__name__}.{name} has {shape[dim]} elements along dimension {dim}, which the "
                    f"{count} blocks of {self.grid} cannot split evenly: choose sizes that divide by {count}"
                )
        full = self.grid.init_full(shape, init, dtype)
        device = device or _context.get_context(default=True).device
        param = nn.Parameter(spec.shard(full).clone().to(device))
        self.register_parameter(name, param)
        self.shard_specs[name] = spec
        return param

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        local = _LOCAL.get()
        for name, spec in self.shard_specs.items():
            param = getattr(self, name)
            if param is None or spec.is_whole:
                continue
            destination[prefix + name] = spec.as_dtensor(param.detach()) if local else spec.gather(param)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], strict: bool,
        missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str],
    ) -> None:  # fmt: skip
        for name, spec in self.shard_specs.items():
            key = prefix + name
            if key in state_dict and not spec.is_whole:
                state_dict[key] = _to_shard(key, state_dict[key], spec)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def _to_shard(key: str, value: Any, spec: ShardSpec) -> Any:
    """The shard of a loaded value: a DTensor's local tensor, a whole tensor's block."""
    if _is_dtensor(value):
        value = value.to_local()
        if value.shape == spec.local_shape():
            return value.clone()  # DCP loads into the parameter's own storage: copying onto itself fails
    elif isinstance(value, torch.Tensor) and value.shape == spec.shape:
        return spec.shard(value)
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
    raise CheckpointError(
        f"state dict entry {key!r} has shape {shape}, not the whole tensor's {tuple(spec.shape)}: it looks like one "
        f"rank's shard of another layout (this rank holds {tuple(spec.local_shape())} on {spec.grid}). Load whole "
        "tensors (engine.state_dict(), model.state_dict(), `ember checkpoint export`) or a sharded checkpoint "
        "directory, which ember reshards"
    )


def _is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a DTensor, without importing DTensor (slow) when nothing did yet."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


@contextlib.contextmanager
def local_shards() -> Iterator[None]:
    """Inside it, grid layers' ``state_dict()`` holds their shards as DTensors (no collective)
    and ``load_state_dict()`` takes such shards: the sharded checkpoints' format.

    Example:
        >>> with local_shards():
        ...     shards = model.state_dict()    # DTensors over each layer's grid mesh
    """
    token = _LOCAL.set(True)
    try:
        yield
    finally:
        _LOCAL.reset(token)


def shard_specs(model: nn.Module) -> dict[str, ShardSpec]:
    """``{parameter name: ShardSpec}`` for every sharded parameter of ``model``'s grid layers."""
    found: dict[str, ShardSpec] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, GridLayer):
            for name, spec in module.shard_specs.items():
                found[f"{prefix}.{name}" if prefix else name] = spec
    return found


def param_specs(model: nn.Module) -> dict[int, ShardSpec]:
    """``{id(parameter): ShardSpec}`` for every sharded parameter of ``model``'s grid layers."""
    found: dict[int, ShardSpec] = {}
    for module in model.modules():
        if isinstance(module, GridLayer):
            for name, spec in module.shard_specs.items():
                param = getattr(module, name, None)
                if isinstance(param, nn.Parameter):
                    found[id(param)] = spec
    return found


def grids_of(model: nn.Module) -> list[TensorGrid]:
    """The distinct grids ``model``'s grid layers live on, in the order first met."""
    seen: dict[int, TensorGrid] = {}
    for module in model.modules():
        if isinstance(module, GridLayer):
            seen.setdefault(id(module.grid), module.grid)
    return list(seen.values())
