"""What the grid layers of every mode share: checks, initialisation, norm and loss kernels.

:func:`layer_norm` normalises features split over an axis (its sums all-reduced there);
:func:`vocab_cross_entropy` is the cross entropy of logits split by class over an axis
(Megatron's: the max, the target's logit and the sum of exponentials all-reduced);
:func:`global_mean` turns per-rank loss sums into the mean over the global batch. Each
layer module (:mod:`~ember.parallel.tensor2d`, :mod:`~ember.parallel.tensor2p5d`,
:mod:`~ember.parallel.tensor3d`) builds its layers from these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import ConfigError, EngineError
from ember.parallel import grid_comm
from ember.parallel.grid import GridLayer, ShardSpec, TensorGrid, launched_grid
from ember.parallel.grid_ops import reduce

Initializer = Callable[..., Any]
"""Colossal-AI's initializer signature: ``init(tensor, fan_in=..., fan_out=...)`` fills ``tensor``."""


def resolve_grid(grid: TensorGrid | None, mode: str, who: str) -> TensorGrid:
    """``grid``, or the launched one; either must be of ``mode``."""
    if grid is None:
        return launched_grid(mode, who)
    if grid.mode != mode:
        raise ConfigError(f"{who} is a {mode} layer, but got a grid of mode {grid.mode!r} ({grid}): pass a {mode} grid")
    return grid


def divisible(who: str, what: str, value: int, by: int, grid: TensorGrid) -> None:
    """Raise ConfigError unless ``by`` divides ``value``."""
    if value % by:
        raise ConfigError(
            f"{who}: {what}={value} does not divide by {by} ({grid}): each rank holds 1/{by} of it; choose a "
            f"{what} divisible by {by}"
        )


def default_linear_init(tensor: torch.Tensor, fan_in: int) -> None:
    """torch's ``nn.Linear`` initialisation for a weight (``fan_in`` > 0) or bias (from its fan-in)."""
    if tensor.dim() > 1:
        nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))
    else:
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        nn.init.uniform_(tensor, -bound, bound)


def initializer(
    custom: Initializer | None, fan_in: int, fan_out: int, default: Callable[[torch.Tensor], Any]
) -> Callable[[torch.Tensor], Any]:
    """An in-place fill of a whole tensor: Colossal-AI's ``custom(t, fan_in=, fan_out=)`` or ``default(t)``."""
    if custom is None:
        return default
    return lambda t: custom(t, fan_in=fan_in, fan_out=fan_out)


def check_features(who: str, x: torch.Tensor, expected: int, axis: str, grid: TensorGrid) -> None:
    """Raise EngineError unless the input's last dimension is this rank's block of the features."""
    if x.shape[-1] != expected:
        raise EngineError(
            f"{who} takes this rank's block of the features along {axis} ({expected} of them on {grid}), got an "
            f"input of shape {tuple(x.shape)}: feed it the output of another layer of this mode, or split the input "
            f"first (split_batch_* and the last dimension over {axis})"
        )


class _LayerNorm(torch.autograd.Function):
    """Normalise the last dimension, split over ``group``: its sums are all-reduced there."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, hidden: int, eps: float, group: Any) -> torch.Tensor:
        x = x.float()
        mean = grid_comm.all_reduce(x.sum(-1, keepdim=True), group) / hidden
        centred = x - mean
        var = grid_comm.all_reduce((centred * centred).sum(-1, keepdim=True), group) / hidden
        rstd = torch.rsqrt(var + eps)
        out = centred * rstd
        ctx.save_for_backward(out, rstd)
        ctx.hidden, ctx.group = hidden, group
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out, rstd = ctx.saved_tensors
        grad = grad.float()
        sums = torch.cat([grad.sum(-1, keepdim=True), (grad * out).sum(-1, keepdim=True)], dim=-1)
        sums = grid_comm.all_reduce(sums, ctx.group) / ctx.hidden
        return (grad - sums[..., :1] - out * sums[..., 1:]) * rstd, None, None, None


def layer_norm(x: torch.Tensor, hidden: int, eps: float, group: Any) -> torch.Tensor:
    """The normalised ``x`` (no affine), its last dimension split over ``group``; float32."""
    return _LayerNorm.apply(x, hidden, eps, group)


class _VocabCrossEntropy(torch.autograd.Function):
    """Per-row cross entropy of logits whose classes are split over ``group``."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Any) -> torch.Tensor:
        logits = logits.float()
        top = grid_comm.all_reduce(logits.max(dim=-1, keepdim=True).values, group, op="max")
        shifted = logits - top
        per = logits.shape[-1]
        start = grid_comm.index(group) * per
        outside = (target < start) | (target >= start + per)
        local = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        sums = grid_comm.all_reduce(torch.stack([exp.sum(-1), picked], dim=-1), group)
        softmax = exp / sums[..., :1]
        ctx.save_for_backward(softmax, local, outside)
        return sums[..., 0].log() - sums[..., 1]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        softmax, local, outside = ctx.saved_tensors
        out = softmax.clone()
        out.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(out.dtype).unsqueeze(-1))
        return out * grad.unsqueeze(-1), None, None


def vocab_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: Any) -> torch.Tensor:
    """The per-row loss of ``logits [rows, classes/n]`` (classes split over ``group``)."""
    return _VocabCrossEntropy.apply(logits, target, group)


def global_mean(loss_sum: torch.Tensor, count: torch.Tensor, group: Any) -> torch.Tensor:
    """``sum / count`` over the rows of every rank of ``group`` (the loss of the global batch)."""
    total = grid_comm.all_reduce(count.detach().to(loss_sum.dtype), group)
    return reduce(loss_sum, group) / total


def normal_with_padding(padding_idx: int | None) -> Callable[[torch.Tensor], None]:
    def fill(t: torch.Tensor) -> None:
        nn.init.normal_(t)
        if padding_idx is not None:
            t[padding_idx].zero_()

    return fill


CROSS_ENTROPY_ARGS = ("weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")


def cross_entropy_options(who: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``F.cross_entropy``'s options from a loss's extra arguments (positional ones in torch's
    order after the target); ``reduction`` is the loss's own boolean, so torch's is refused."""
    options = {**dict(zip(CROSS_ENTROPY_ARGS, args, strict=False)), **kwargs}
    clash = sorted(k for k in options if k in ("size_average", "reduce", "reduction"))
    if clash:
        raise ConfigError(
            f"{who} takes reduction=True/False (the mean of the global batch, or per-row losses), not {clash}"
        )
    return options


def rows_counted(targets: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """What ``F.cross_entropy``'s mean divides by: the rows not ignored, weighted by class weight."""
    weight = kwargs.get("weight")
    if targets.is_floating_point():  # class probabilities: every row counts once
        return torch.tensor(float(targets.shape[0]), device=targets.device)
    kept = targets != kwargs.get("ignore_index", -100)
    if weight is None:
        return kept.sum().float()
    return (weight[targets.clamp(min=0)] * kept).sum().float()


def patch_shapes(
    who: str, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], flatten: bool
) -> tuple[tuple[int, int], tuple[int, int], int]:
    """``(img_size, patch_size, patches)`` as pairs and a count; checked."""
    img = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    patch = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    if not flatten:
        raise ConfigError(f"{who}(flatten=False) is not supported: the class token joins the patches as a sequence")
    if img[0] % patch[0] or img[1] % patch[1]:
        raise ConfigError(f"{who}: img_size {img} is not a whole number of patches of {patch}")
    return (img[0], img[1]), (patch[0], patch[1]), (img[0] // patch[0]) * (img[1] // patch[1])


def check_image(who: str, images: torch.Tensor, size: tuple[int, int]) -> None:
    """Raise EngineError unless ``images`` is ``[batch, channels, *size]``."""
    if images.dim() != 4 or tuple(images.shape[-2:]) != size:
        raise EngineError(
            f"{who} takes images [batch, channels, {size[0]}, {size[1]}], got shape {tuple(images.shape)}"
        )


def share(
    layer: GridLayer, name: str, weight: nn.Parameter, shape: tuple[int, ...], split_: tuple[int | None, ...]
) -> None:
    """Register another layer's parameter ``weight`` as ``layer.name`` (tied weights), checked."""
    spec = ShardSpec(layer.grid, split_, torch.Size(shape))
    if tuple(weight.shape) != tuple(spec.local_shape()):
        raise ConfigError(
            f"{type(layer).__name__}(weight=...) got a parameter of shape {tuple(weight.shape)}; on {layer.grid} it "
            f"must be this rank's block {tuple(spec.local_shape())} of a whole {shape}"
        )
    layer.register_parameter(name, weight)
    layer.shard_specs[name] = spec


# -- the parameters of each kind of layer, for every mode (its split given) ------------------------
Split = tuple[int | None, ...]
"""A parameter's split over its grid's axes (see :class:`~ember.parallel.grid.ShardSpec`)."""


def build_linear(
    layer: GridLayer, in_features: int, out_features: int, bias: bool, dtype: torch.dtype | None,
    weight_initializer: Initializer | None, bias_initializer: Initializer | None, weight: Split, bias_split: Split,
) -> None:  # fmt: skip
    """``layer.weight [out, in]`` and ``layer.bias [out]`` (or None), torch's initialisation by default."""
    layer.in_features, layer.out_features = in_features, out_features
    _weight_and_bias(layer, in_features, out_features, None, bias, dtype, (weight_initializer, bias_initializer),
                     weight, bias_split)  # fmt: skip


def _weight_and_bias(
    layer: GridLayer, in_features: int, out_features: int, shared: nn.Parameter | None, bias: bool,
    dtype: torch.dtype | None, initializers: tuple[Initializer | None, Initializer | None], weight_split: Split,
    bias_split: Split,
) -> None:  # fmt: skip
    """``layer.weight [out, in]`` (``shared`` when given) and ``layer.bias [out]`` (or None)."""
    weight_init, bias_init = initializers
    if shared is not None:
        share(layer, "weight", shared, (out_features, in_features), weight_split)
    else:
        fill = initializer(weight_init, in_features, out_features, lambda t: default_linear_init(t, in_features))
        layer.shard_parameter("weight", (out_features, in_features), weight_split, fill, dtype)
    if bias:
        fill = initializer(bias_init, in_features, out_features, lambda t: default_linear_init(t, in_features))
        layer.shard_parameter("bias", (out_features,), bias_split, fill, dtype)
    else:
        layer.register_parameter("bias", None)


def build_norm(
    layer: GridLayer, normalized_shape: int, eps: float, bias: bool, dtype: torch.dtype | None, split: Split
) -> None:
    """``layer.weight`` (ones) and ``layer.bias`` (zeros, or None) of a LayerNorm over ``normalized_shape``."""
    layer.normalized_shape, layer.eps = int(normalized_shape), eps
    layer.shard_parameter("weight", (int(normalized_shape),), split, nn.init.ones_, dtype)
    if bias:
        layer.shard_parameter("bias", (int(normalized_shape),), split, nn.init.zeros_, dtype)
    else:
        layer.register_parameter("bias", None)


def build_embedding(
    layer: GridLayer, num_embeddings: int, embedding_dim: int, padding_idx: int | None, dtype: torch.dtype | None,
    weight_initializer: Initializer | None, split: Split, args: tuple[Any, ...], kwargs: dict[str, Any],
) -> None:  # fmt: skip
    """``layer.weight [vocab, dim]`` (``normal_``, the padding row zero) and the lookup's options."""
    layer.num_embeddings, layer.embedding_dim, layer.padding_idx = num_embeddings, embedding_dim, padding_idx
    layer.embed_args, layer.embed_kwargs = args, kwargs
    fill = initializer(weight_initializer, num_embeddings, embedding_dim, normal_with_padding(padding_idx))
    layer.shard_parameter("weight", (num_embeddings, embedding_dim), split, fill, dtype)


def vocab_block(layer: GridLayer, index: int, parts: int) -> None:
    """``layer.vocab_start``/``vocab_end``: the vocabulary block ``index`` of ``parts`` this rank holds."""
    per = layer.num_embeddings // parts
    layer.vocab_start, layer.vocab_end = index * per, (index + 1) * per


def vocab_lookup(layer: GridLayer, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The embeddings of the ids in this rank's vocabulary block, zero for the others (to be summed)."""
    start, end = layer.vocab_start, layer.vocab_end
    outside = (ids < start) | (ids >= end)
    local = (ids - start).masked_fill(outside, 0)
    padding = layer.padding_idx - start if layer.padding_idx is not None and start <= layer.padding_idx < end else None
    out = F.embedding(local, weight, padding, *layer.embed_args, **layer.embed_kwargs)
    return out.masked_fill(outside.unsqueeze(-1), 0.0)


def build_patch_embedding(
    layer: GridLayer, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], in_chans: int,
    embed_size: int, flatten: bool, dtype: torch.dtype | None, initializers: tuple[Initializer | None, ...],
    channels: Split, last: Split,
) -> None:  # fmt: skip
    """A patch embedding's convolution ``weight``/``bias`` (split by ``channels``), ``cls_token`` and
    ``pos_embed`` (split by ``last``); ``initializers`` = (weight, bias, position embedding)."""
    layer.img_size, layer.patch_size, layer.num_patches = patch_shapes(
        type(layer).__name__, img_size, patch_size, flatten
    )
    layer.embed_size = embed_size
    fan_in = in_chans * layer.patch_size[0] * layer.patch_size[1]
    weight_init, bias_init, position_init = initializers
    fill = initializer(weight_init, fan_in, embed_size, lambda t: default_linear_init(t, fan_in))
    layer.shard_parameter("weight", (embed_size, in_chans, *layer.patch_size), channels, fill, dtype)
    fill = initializer(bias_init, fan_in, embed_size, lambda t: default_linear_init(t, fan_in))
    layer.shard_parameter("bias", (embed_size,), channels, fill, dtype)
    layer.shard_parameter("cls_token", (1, 1, embed_size), last, nn.init.zeros_, dtype)
    fill = initializer(position_init, fan_in, embed_size, nn.init.zeros_)
    layer.shard_parameter("pos_embed", (1, layer.num_patches + 1, embed_size), last, fill, dtype)


def patch_forward(
    layer: GridLayer, images: torch.Tensor, through: Callable[[torch.Tensor], torch.Tensor] = lambda p: p
) -> torch.Tensor:
    """``[batch, patches + 1, embed]`` of ``images`` (already this rank's rows), each parameter
    passed ``through`` (e.g. a gradient sum): the class token first, plus the position embedding."""
    params = (layer.weight, layer.bias, layer.cls_token, layer.pos_embed)
    weight, bias, cls, pos = (through(p) for p in params if p is not None)
    out = F.conv2d(images, weight, bias, stride=layer.patch_size).flatten(2).transpose(1, 2)
    return torch.cat((cls.expand(out.shape[0], -1, -1), out), dim=1) + pos


def build_classifier(
    layer: GridLayer, in_features: int, num_classes: int, weight: nn.Parameter | None, bias: bool,
    dtype: torch.dtype | None, initializers: tuple[Initializer | None, Initializer | None], weight_split: Split,
    bias_split: Split,
) -> None:  # fmt: skip
    """A classifier's ``weight [classes, in]`` (or ``weight``, shared) and ``bias [classes]`` (or None)."""
    layer.in_features, layer.num_classes = in_features, num_classes
    _weight_and_bias(layer, in_features, num_classes, weight, bias, dtype, initializers, weight_split, bias_split)


def correct_count(logits: torch.Tensor, targets: torch.Tensor, group: Any) -> torch.Tensor:
    """How many of this rank's rows have their largest logit at ``targets`` (this rank's rows),
    summed over ``group`` (the ranks holding the batch's other rows): the whole batch's count,
    on every rank, as ``AccuracyHook`` expects."""
    correct = (logits.argmax(dim=-1) == targets).sum()
    return grid_comm.all_reduce(correct, group)


class VocabClassifier:
    """A classification head split by class: the mode's Linear to the classes (this class first
    in the bases, the Linear after it). ``weight`` is refused: sharing a weight is the mode's
    plain classifier's (:attr:`shares_with`)."""

    shares_with = "the plain classifier"

    def __init__(
        self, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        if weight is not None:
            raise ConfigError(
                f"{type(self).__name__}(weight=...) is not supported: share a weight with {self.shares_with}"
            )
        linear_init: Any = super().__init__  # the mode's Linear: (in, out, bias, dtype, skip_bias_add, inits, grid)
        linear_init(in_features, num_classes, bias, dtype, False, weight_initializer, bias_initializer, grid)
        self.num_classes = num_classes
