"""1-D (Megatron) tensor parallel layers on a grid of one axis, ``tensor`` — Colossal-AI's ``Linear1D`` & co.

ember's own 1-D tensor parallelism splits a plain model with a plan (:mod:`ember.parallel.tensor`,
DTensor). These layers are the other way, Colossal-AI's: the model is built from them and each
picks its split when it is built. An activation is either whole on every rank (*replicated*)
or split by features; :attr:`~ember.parallel.grid.TensorGrid.flipped` says which the next
layer gets (Colossal-AI's ``parallel_input``):

================================  ===============================================================
layer                             what it holds and does
================================  ===============================================================
:class:`Linear1D`                 :class:`Linear1D_Col` after a replicated activation (output split
                                  unless ``gather_output``), else :class:`Linear1D_Row`
:class:`Linear1D_Col`             ``W[out/P, in]``; the input's gradient summed over the group
:class:`Linear1D_Row`             ``W[out, in/P]``; the product all-reduced (replicated output)
:class:`LayerNorm1D`,             whole parameters on every rank (replicated activations)
:class:`PatchEmbedding1D`
:class:`Embedding1D`              ``[vocab, dim/P]``; the lookups all-gathered
:class:`VocabParallelEmbedding1D` ``[vocab/P, dim]``; the lookups all-reduced
:class:`Classifier1D`             ``[classes, hidden/P]``; the logits all-reduced
:class:`VocabParallelClassifier1D` ``[classes/P, hidden]``: logits split by class
:class:`Dropout1D`                the same mask on every rank for a replicated activation
================================  ===============================================================

Example:
    >>> # parallel = dict(tensor=dict(size=2, mode="1d")); 2 processes
    >>> fc1, fc2 = Linear1D(16, 64), Linear1D(64, 16)   # column- then row-parallel
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.errors import ConfigError
from ember.parallel import grid_comm
from ember.parallel.grid import GridLayer, TensorGrid
from ember.parallel.grid_layers import (
    Initializer,
    check_image,
    default_linear_init,
    divisible,
    initializer,
    normal_with_padding,
    patch_shapes,
    resolve_grid,
    share,
    vocab_cross_entropy,
)
from ember.parallel.grid_ops import grad_sum, reduce, split, unsplit

__all__ = [
    "Classifier1D",
    "Dropout1D",
    "Embedding1D",
    "LayerNorm1D",
    "Linear1D",
    "Linear1D_Col",
    "Linear1D_Row",
    "PatchEmbedding1D",
    "VocabParallelClassifier1D",
    "VocabParallelCrossEntropyLoss1D",
    "VocabParallelEmbedding1D",
]


class _Line(GridLayer):
    mode = "1d"

    def __init__(self, grid: TensorGrid | None) -> None:
        super().__init__(resolve_grid(grid, self.mode, type(self).__name__))
        self.parts = self.grid.size("tensor")
        self.parallel_input = self.grid.flipped
        """Whether this layer's input arrives split by features (set when it was built)."""

    @property
    def group(self) -> Any:
        """The tensor group."""
        return self.grid.group("tensor")

    def divisible(self, what: str, value: int) -> None:
        divisible(type(self).__name__, what, value, self.parts, self.grid)

    def linear_fill(self, custom: Initializer | None, fan_in: int, fan_out: int) -> Any:
        return initializer(custom, fan_in, fan_out, lambda t: default_linear_init(t, fan_in))


class Linear1D_Col(_Line):
    """Column-parallel ``y = x W^T + b``: replicated input, output split by features
    (``gather_output=True``: gathered whole).

    Args:
        in_features: the input features.
        out_features: the output features (divisible by the tensor size).
        bias: learn a bias (``[out/P]``).
        dtype: the parameters' dtype.
        gather_output: all-gather the output (the next layer gets it whole).
        skip_bias_add: return ``(x W^T, b)`` instead of adding.
        weight_initializer: ``init(tensor, fan_in=, fan_out=)``; default torch's.
        bias_initializer: likewise.
        grid: the grid (default: the launched layout's).
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype | None = None,
        gather_output: bool = False, skip_bias_add: bool = False, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        self.divisible("out_features", out_features)
        fill = self.linear_fill(weight_initializer, in_features, out_features)
        self.weight = self.shard_parameter("weight", (out_features, in_features), (0,), fill, dtype)
        if bias:
            fill = self.linear_fill(bias_initializer, in_features, out_features)
            self.bias = self.shard_parameter("bias", (out_features,), (0,), fill, dtype)
        else:
            self.register_parameter("bias", None)
        self.grid.flipped = not gather_output

    def forward(self, x: torch.Tensor) -> Any:
        """``x [..., in]`` (whole) -> ``[..., out/P]`` (or whole with ``gather_output``)."""
        out = F.linear(grad_sum(x, self.group), self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            out = unsplit(out, -1, self.group)
        return (out, self.bias) if self.skip_bias_add else out


class Linear1D_Row(_Line):
    """Row-parallel ``y = x W^T + b``: input split by features (or split here when
    ``parallel_input=False``), the products all-reduced: a replicated output.

    Args:
        in_features: the input features (divisible by the tensor size).
        out_features: the output features.
        bias: learn a bias (whole, on every rank).
        dtype: the parameters' dtype.
        parallel_input: the input arrives split by features (default True).
        skip_bias_add: return ``(x W^T, b)`` instead of adding.
        weight_initializer: ``init(tensor, fan_in=, fan_out=)``; default torch's.
        bias_initializer: likewise.
        grid: the grid (default: the launched layout's).
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype | None = None,
        parallel_input: bool = True, skip_bias_add: bool = False, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.in_features, self.out_features = in_features, out_features
        self.parallel_input, self.skip_bias_add = parallel_input, skip_bias_add
        self.divisible("in_features", in_features)
        fill = self.linear_fill(weight_initializer, in_features, out_features)
        self.weight = self.shard_parameter("weight", (out_features, in_features), (1,), fill, dtype)
        if bias:
            fill = self.linear_fill(bias_initializer, in_features, out_features)
            self.bias = self.shard_parameter("bias", (out_features,), (None,), fill, dtype)
        else:
            self.register_parameter("bias", None)
        self.grid.flipped = False

    def forward(self, x: torch.Tensor) -> Any:
        """``x [..., in/P]`` (or whole) -> ``[..., out]`` on every rank."""
        if not self.parallel_input:
            x = split(x, -1, self.group, "input feature dimension")
        out = reduce(F.linear(x, self.weight), self.group)
        if self.bias is None:
            return out
        return (out, self.bias) if self.skip_bias_add else out + self.bias


def Linear1D(
    in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype | None = None,
    gather_output: bool = False, skip_bias_add: bool = False, weight_initializer: Initializer | None = None,
    bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
) -> nn.Module:  # fmt: skip
    """A :class:`Linear1D_Col` when the input arrives whole and ``gather_output`` is off, else a
    :class:`Linear1D_Row`: consecutive Linears alternate, as Colossal-AI's ``Linear1D`` does.

    Returns:
        The layer (its ``parallel_input`` tells which input it takes).
    """
    grid = resolve_grid(grid, "1d", "Linear1D")
    if not grid.flipped and not gather_output:
        return Linear1D_Col(in_features, out_features, bias, dtype, False, skip_bias_add, weight_initializer,
                            bias_initializer, grid)  # fmt: skip
    return Linear1D_Row(in_features, out_features, bias, dtype, grid.flipped, skip_bias_add, weight_initializer,
                        bias_initializer, grid)  # fmt: skip


class LayerNorm1D(_Line):
    """LayerNorm of a replicated activation: whole parameters on every rank.

    Args:
        normalized_shape: the hidden size.
        eps: added to the variance.
        bias: learn a bias.
        dtype: the parameters' dtype.
        grid: the grid (default: the launched layout's).
    """

    def __init__(
        self, normalized_shape: int, eps: float = 1e-5, bias: bool = True, dtype: torch.dtype | None = None,
        grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.normalized_shape, self.eps = (int(normalized_shape),), eps
        self.weight = self.shard_parameter("weight", self.normalized_shape, (None,), nn.init.ones_, dtype)
        if bias:
            self.bias = self.shard_parameter("bias", self.normalized_shape, (None,), nn.init.zeros_, dtype)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the whole last dimension."""
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding1D(_Line):
    """An embedding table ``[vocab, dim/P]``; the lookups all-gathered: a replicated output.

    Args: as :class:`~ember.parallel.tensor2d.Embedding2D` (``embedding_dim`` divisible by P).
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None, *args: Any,
        grid: TensorGrid | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.embed_args, self.embed_kwargs = args, kwargs
        self.divisible("embedding_dim", embedding_dim)
        fill = initializer(weight_initializer, num_embeddings, embedding_dim, normal_with_padding(padding_idx))
        self.weight = self.shard_parameter("weight", (num_embeddings, embedding_dim), (1,), fill, dtype)
        self.grid.flipped = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look ``ids`` up in this rank's columns, then gather the columns."""
        out = F.embedding(ids, self.weight, self.padding_idx, *self.embed_args, **self.embed_kwargs)
        return unsplit(out, -1, self.group)


class VocabParallelEmbedding1D(_Line):
    """An embedding table ``[vocab/P, dim]``; each rank looks up its vocabulary, the lookups
    summed: a replicated output.

    Args: as :class:`~ember.parallel.tensor2d.Embedding2D` (``num_embeddings`` divisible by P).
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None, *args: Any,
        grid: TensorGrid | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.embed_args, self.embed_kwargs = args, kwargs
        self.divisible("num_embeddings", num_embeddings)
        fill = initializer(weight_initializer, num_embeddings, embedding_dim, normal_with_padding(padding_idx))
        self.weight = self.shard_parameter("weight", (num_embeddings, embedding_dim), (0,), fill, dtype)
        per = num_embeddings // self.parts
        self.vocab_start = self.grid.coord("tensor") * per
        self.vocab_end = self.vocab_start + per
        self.grid.flipped = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up the ids of this rank's vocabulary, sum over the ranks."""
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        padding = None
        if self.padding_idx is not None and self.vocab_start <= self.padding_idx < self.vocab_end:
            padding = self.padding_idx - self.vocab_start
        out = F.embedding(local, self.weight, padding, *self.embed_args, **self.embed_kwargs)
        return reduce(out.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class PatchEmbedding1D(_Line):
    """A ViT's patch embedding with whole parameters on every rank: ``[batch, patches + 1, embed]``.

    Args: as :class:`~ember.parallel.tensor2d.PatchEmbedding2D`.
    """

    def __init__(
        self, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], in_chans: int, embed_size: int,
        flatten: bool = True, dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, position_embed_initializer: Initializer | None = None,
        grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.img_size, self.patch_size, self.num_patches = patch_shapes(
            type(self).__name__, img_size, patch_size, flatten
        )
        fan_in = in_chans * self.patch_size[0] * self.patch_size[1]
        whole: tuple[int | None] = (None,)
        fill = self.linear_fill(weight_initializer, fan_in, embed_size)
        self.weight = self.shard_parameter("weight", (embed_size, in_chans, *self.patch_size), whole, fill, dtype)
        self.bias = self.shard_parameter(
            "bias", (embed_size,), whole, self.linear_fill(bias_initializer, fan_in, embed_size), dtype
        )
        self.cls_token = self.shard_parameter("cls_token", (1, 1, embed_size), whole, nn.init.zeros_, dtype)
        fill = initializer(position_embed_initializer, fan_in, embed_size, nn.init.zeros_)
        self.pos_embed = self.shard_parameter("pos_embed", (1, self.num_patches + 1, embed_size), whole, fill, dtype)
        self.grid.flipped = False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embed the whole batch of ``images``."""
        check_image(type(self).__name__, images, self.img_size)
        out = F.conv2d(images, self.weight, self.bias, stride=self.patch_size).flatten(2).transpose(1, 2)
        return torch.cat((self.cls_token.expand(out.shape[0], -1, -1), out), dim=1) + self.pos_embed


class Classifier1D(_Line):
    """A classification head ``[classes, hidden/P]``: the products all-reduced (whole logits
    on every rank); a replicated input is split here.

    Args: as :class:`~ember.parallel.tensor2d.Classifier2D` (``in_features`` divisible by P).
    """

    def __init__(
        self, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.in_features, self.num_classes = in_features, num_classes
        self.divisible("in_features", in_features)
        if weight is not None:
            share(self, "weight", weight, (num_classes, in_features), (1,))
        else:
            fill = self.linear_fill(weight_initializer, in_features, num_classes)
            self.weight = self.shard_parameter("weight", (num_classes, in_features), (1,), fill, dtype)
        if bias:
            fill = self.linear_fill(bias_initializer, in_features, num_classes)
            self.bias = self.shard_parameter("bias", (num_classes,), (None,), fill, dtype)
        else:
            self.register_parameter("bias", None)
        self.grid.flipped = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of ``x``, on every rank."""
        if not self.parallel_input:
            x = split(x, -1, self.group, "input feature dimension")
        out = reduce(F.linear(x, self.weight), self.group)
        return out if self.bias is None else out + self.bias


class VocabParallelClassifier1D(_Line):
    """A classification head split by class, ``[classes/P, hidden]``: logits ``[..., classes/P]``
    (whole with ``gather_output``). Its input must be whole.

    Args: as :class:`Linear1D_Col`, with ``num_classes`` for ``out_features``; ``weight`` may
    share a :class:`VocabParallelEmbedding1D`'s table.
    """

    def __init__(
        self, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, gather_output: bool = False, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        if self.parallel_input:
            raise ConfigError(f"{type(self).__name__} takes a whole input; the layer before it splits its output")
        self.in_features, self.num_classes, self.gather_output = in_features, num_classes, gather_output
        self.divisible("num_classes", num_classes)
        if weight is not None:
            share(self, "weight", weight, (num_classes, in_features), (0,))
        else:
            fill = self.linear_fill(weight_initializer, in_features, num_classes)
            self.weight = self.shard_parameter("weight", (num_classes, in_features), (0,), fill, dtype)
        if bias:
            fill = self.linear_fill(bias_initializer, in_features, num_classes)
            self.bias = self.shard_parameter("bias", (num_classes,), (0,), fill, dtype)
        else:
            self.register_parameter("bias", None)
        self.grid.flipped = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's classes' logits (or all of them with ``gather_output``)."""
        out = F.linear(grad_sum(x, self.group), self.weight, self.bias)
        return unsplit(out, -1, self.group) if self.gather_output else out


class Dropout1D(_Line):
    """Dropout; on a replicated activation every rank draws the same mask (a seed broadcast
    from the group's first rank, drawn from its checkpointed generator).

    Args:
        p: the drop probability.
        inplace: drop in place.
        grid: the grid (default: the launched layout's).
    """

    def __init__(self, p: float = 0.5, inplace: bool = False, grid: TensorGrid | None = None) -> None:
        super().__init__(grid)
        self.p, self.inplace = p, inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with elements dropped (scaled by ``1/(1-p)``) in training."""
        if not self.training or self.p == 0 or self.parallel_input:
            return F.dropout(x, self.p, self.training, self.inplace)
        seed = grid_comm.broadcast(torch.randint(0, 2**62, (1,), device=x.device), 0, self.group)
        generator = torch.Generator(device=x.device).manual_seed(int(seed.item()))
        keep = torch.empty_like(x).bernoulli_(1 - self.p, generator=generator)
        return x * keep / (1 - self.p)


class VocabParallelCrossEntropyLoss1D(nn.Module):
    """Cross entropy of logits split by class over the tensor group (a
    :class:`VocabParallelClassifier1D`'s); the mean over the batch, on every rank.

    Args:
        reduction: True for the mean; False for per-row losses.
        grid: the grid (default: the launched layout's).
    """

    def __init__(self, reduction: bool = True, grid: TensorGrid | None = None) -> None:
        super().__init__()
        self.grid = resolve_grid(grid, "1d", type(self).__name__)
        self.reduction_mean = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of the batch; the logits hold this rank's classes."""
        rows = vocab_cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), self.grid.group("tensor"))
        return rows.mean() if self.reduction_mean else rows.reshape(targets.shape)
