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
    build_classifier,
    build_embedding,
    build_linear,
    build_norm,
    build_patch_embedding,
    check_image,
    default_linear_init,
    divisible,
    initializer,
    patch_forward,
    resolve_grid,
    vocab_block,
    vocab_cross_entropy,
    vocab_lookup,
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
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        self.divisible("out_features", out_features)
        build_linear(self, in_features, out_features, bias, dtype, weight_initializer, bias_initializer, (0,), (0,))
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
        self.parallel_input, self.skip_bias_add = parallel_input, skip_bias_add
        self.divisible("in_features", in_features)
        build_linear(self, in_features, out_features, bias, dtype, weight_initializer, bias_initializer, (1,), (None,))
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
        build_norm(self, normalized_shape, eps, bias, dtype, (None,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the whole last dimension."""
        return F.layer_norm(x, (self.normalized_shape,), self.weight, self.bias, self.eps)


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
        self.divisible("embedding_dim", embedding_dim)
        build_embedding(self, num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, (1,), args, kwargs)
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
        self.divisible("num_embeddings", num_embeddings)
        build_embedding(self, num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, (0,), args, kwargs)
        vocab_block(self, self.grid.coord("tensor"), self.parts)
        self.grid.flipped = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up the ids of this rank's vocabulary, sum over the ranks."""
        return reduce(vocab_lookup(self, ids, self.weight), self.group)


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
        inits = (weight_initializer, bias_initializer, position_embed_initializer)
        build_patch_embedding(self, img_size, patch_size, in_chans, embed_size, flatten, dtype, inits, (None,), (None,))
        self.grid.flipped = False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embed the whole batch of ``images``."""
        check_image(type(self).__name__, images, self.img_size)
        return patch_forward(self, images)


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
        self.divisible("in_features", in_features)
        build_classifier(self, in_features, num_classes, weight, bias, dtype, (weight_initializer, bias_initializer),
                         (1,), (None,))  # fmt: skip
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
        self.gather_output = gather_output
        self.divisible("num_classes", num_classes)
        build_classifier(self, in_features, num_classes, weight, bias, dtype, (weight_initializer, bias_initializer),
                         (0,), (0,))  # fmt: skip
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
