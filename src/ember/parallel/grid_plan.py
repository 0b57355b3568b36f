"""Placing a model on a 2-D, 2.5-D or 3-D grid: the checks before any collective, and the build.

A model under ``parallel.tensor.mode`` ``"2d"``, ``"2.5d"`` or ``"3d"`` is either

* **built from the mode's layers** (:mod:`~ember.parallel.tensor2d`,
  :mod:`~ember.parallel.tensor2p5d`, :mod:`~ember.parallel.tensor3d`, or Colossal-AI's
  ``colossalai.nn`` layers, which are those): every parameter must then belong to one of them,
  on the grid of the Engine's layout (:func:`check_grid_model`); or
* **a plain model** (2-D and 2.5-D, with no ``parallel.tensor.plan``): ember recognises its
  ``nn.Linear``, ``nn.LayerNorm`` and ``nn.Embedding`` layers and replaces each with the mode's
  layer holding this rank's blocks of its weights (:func:`convert_model`); the model's input is
  split over the grid when it enters (floating tensors by batch and features, token ids left
  whole for the embedding) and its output gathered whole when it leaves, so the user's own
  loss sees the whole output. Any other module with parameters is named in a ``ConfigError``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember.config import Config
from ember.errors import ConfigError
from ember.layout import ParallelLayout
from ember.parallel.grid import GRID_MODES, GridLayer, TensorGrid, grids_of, param_specs
from ember.parallel.grid_ops import split, unsplit
from ember.parallel.summa import batch_axis

__all__ = ["check_grid_model", "convert_model", "sync_replicas"]

CONVERTIBLE = (nn.Linear, nn.LayerNorm, nn.Embedding)
"""The plain layers ``plan=None`` places on a 2-D or 2.5-D grid."""


def check_grid_model(model: nn.Module, layout: ParallelLayout, cfg: Config, pipeline: bool) -> str:
    """Check ``model`` against the grid mode of ``layout`` before anything is built.

    Returns:
        ``"built"`` (the model's layers are the mode's, on this layout) or ``"convert"`` (a plain
        2-D/2.5-D model whose Linear/LayerNorm/Embedding layers :func:`convert_model` replaces).

    Raises:
        ConfigError: ``zero`` or a ``plan`` with a grid mode; a layer built for another layout or
            mode; a parameter outside the mode's layers; a plain model under 3-D or inside a
            pipeline; a plain layer whose sizes the grid does not divide; a plain module with
            parameters that no layer of the mode places.
    """
    mode = layout.tensor_mode
    if cfg.zero and int(cfg.zero.stage):
        raise ConfigError(
            f"config zero.stage={cfg.zero.stage} with parallel.tensor.mode={mode!r}: the {mode} layers shard their "
            "parameters already; remove zero (data parallelism averages the gradients of the shards)"
        )
    if cfg.parallel.tensor.plan is not None:
        raise ConfigError(
            f"config parallel.tensor.plan applies to mode='1d'; under mode={mode!r} build the model from the mode's "
            "layers (ember.parallel.layers.layers_for(grid), colossalai.nn.Linear & co.) or leave plan unset to "
            "have a plain model's Linear/LayerNorm/Embedding layers placed"
        )
    grids = grids_of(model)
    for grid in grids:
        if grid.layout != layout:
            owner = next(n for n, m in model.named_modules() if isinstance(m, GridLayer) and m.grid is grid)
            raise ConfigError(
                f"layer {owner!r} ({type(model.get_submodule(owner)).__name__}) was built on {grid} of "
                f"{grid.layout}, but this Engine's config asks for {layout}: build the model's layers on "
                "grid_of(<this layout>) (or under the launched config it describes), or change the config"
            )
    if grids:
        placed = param_specs(model)
        for name, module in model.named_modules():
            own = [n for n, p in module.named_parameters(recurse=False) if id(p) not in placed]
            if own and not isinstance(module, GridLayer):
                raise ConfigError(
                    f"module {name or '<root>'!r} ({type(module).__name__}) holds parameters {own} that no {mode} "
                    f"layer places: under parallel.tensor.mode={mode!r} activations are split over the grid, so every "
                    f"parameter must belong to a {mode} layer (Linear, LayerNorm, Embedding, PatchEmbedding, "
                    "Classifier, ... of ember.parallel.layers.layers_for(grid) or colossalai.nn)"
                )
        return "built"
    if mode == "3d" or pipeline:
        why = "3-D layers must be built in the order activations flow" if mode == "3d" else "inside a pipeline stage"
        raise ConfigError(
            f"parallel.tensor.mode={mode!r} needs the model built from its layers ({why}): use "
            "ember.parallel.layers.layers_for(grid) or colossalai.nn.Linear & co.; a plain model is converted only "
            "under mode='2d' or '2.5d' without pipeline parallelism"
        )
    _check_convertible(model, layout)
    return "convert"


def _check_convertible(model: nn.Module, layout: ParallelLayout) -> None:
    q = layout.size("tensor_row")
    for name, module in model.named_modules():
        if isinstance(module, CONVERTIBLE):
            sizes = _split_sizes(module)
            bad = {k: v for k, v in sizes.items() if v % q}
            if bad:
                raise ConfigError(
                    f"{type(module).__name__} {name!r} has {bad}, which the {q} ranks of a {layout.tensor_mode} row "
                    f"cannot split: choose sizes divisible by {q}, or another tensor size"
                )
            if isinstance(module, nn.LayerNorm) and len(module.normalized_shape) != 1:
                raise ConfigError(
                    f"LayerNorm {name!r} normalises {module.normalized_shape}: only the last dimension is placed"
                )
            continue
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if own:
            raise ConfigError(
                f"module {name or '<root>'!r} ({type(module).__name__}) holds parameters {own} that "
                f"parallel.tensor.mode={layout.tensor_mode!r} cannot place: ember converts nn.Linear, nn.LayerNorm "
                "and nn.Embedding layers of a plain model; build the rest from ember.parallel.layers.layers_for(grid) "
                "(PatchEmbedding, Classifier, ...) or colossalai.nn"
            )


def _split_sizes(module: nn.Module) -> dict[str, int]:
    if isinstance(module, nn.Linear):
        return {"in_features": module.in_features, "out_features": module.out_features}
    if isinstance(module, nn.LayerNorm):
        return {"normalized_shape": int(module.normalized_shape[-1])}
    if isinstance(module, nn.Embedding):
        return {"embedding_dim": module.embedding_dim}
    return {}


def convert_model(model: nn.Module, grid: TensorGrid) -> list[str]:
    """Replace ``model``'s nn.Linear/LayerNorm/Embedding with ``grid``'s layers (this rank's blocks
    of their weights) and split/gather the model's input/output at its boundary.

    Returns:
        The names of the replaced layers.
    """
    from ember.parallel.layers import layers_for

    L = layers_for(grid)
    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, CONVERTIBLE):
            continue
        if isinstance(module, nn.Linear):
            new = L.Linear(module.in_features, module.out_features, bias=module.bias is not None)
        elif isinstance(module, nn.LayerNorm):
            new = L.LayerNorm(int(module.normalized_shape[0]), eps=module.eps, bias=module.bias is not None)
        else:
            new = L.Embedding(module.num_embeddings, module.embedding_dim, module.padding_idx, None, None,
                              max_norm=module.max_norm, norm_type=module.norm_type,
                              scale_grad_by_freq=module.scale_grad_by_freq, sparse=module.sparse)  # fmt: skip
        new.load_state_dict(module.state_dict(), strict=False)
        if isinstance(module, nn.LayerNorm) and not module.elementwise_affine:
            new.weight.requires_grad_(False)
        new.to(next((t.device for t in module.parameters()), new.weight.device))
        _replace(model, name, new)
        replaced.append(name)
    boundary = _Boundary(grid)
    model.register_forward_pre_hook(boundary.enter)
    model.register_forward_hook(boundary.leave)
    return replaced


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, new)


class _Boundary:
    """Split a converted model's floating inputs over the grid; gather its outputs whole."""

    def __init__(self, grid: TensorGrid) -> None:
        self.rows = grid.group(batch_axis(grid))
        self.features = grid.group("tensor_row")

    def enter(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(self._split(a) for a in args)

    def leave(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return self._gather(output)
        if isinstance(output, tuple):
            return tuple(self._gather(o) if isinstance(o, torch.Tensor) else o for o in output)
        return output

    def _split(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value  # token ids: the embedding splits them by batch itself
        return split(split(value, 0, self.rows, "batch"), -1, self.features, "input feature dimension")

    def _gather(self, value: torch.Tensor) -> torch.Tensor:
        if not value.is_floating_point():
            return value
        return unsplit(unsplit(value, -1, self.features), 0, self.rows)


def sync_replicas(model: nn.Module, data_group: Any) -> None:
    """Make every copy of each parameter block equal: broadcast from the first rank of each axis
    the block is replicated over (and from the first data replica). A collective."""
    specs = param_specs(model)
    with torch.no_grad():
        buckets: dict[Any, list[torch.Tensor]] = {}
        for p in model.parameters():
            spec = specs.get(id(p))
            if spec is None:
                continue
            for axis, dim in zip(spec.grid.axes, spec.split, strict=True):
                group = spec.grid.group(axis) if dim is None else None
                if group is not None:
                    buckets.setdefault(group, []).append(p.data)
        if data_group is not None:
            buckets[data_group] = [p.data for p in model.parameters()]
        for group, tensors in buckets.items():
            for dtype in {t.dtype for t in tensors}:
                same = [t for t in tensors if t.dtype == dtype]
                flat = torch.cat([t.reshape(-1) for t in same])
                dist.broadcast(flat, src=dist.get_global_rank(group, 0), group=group)
                offset = 0
                for t in same:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()


def is_grid_mode(layout: ParallelLayout) -> bool:
    """Whether ``layout``'s tensor mode is 2-D, 2.5-D or 3-D."""
    return layout.tensor_mode in GRID_MODES
