"""2-D tensor parallelism (Optimus: SUMMA on a q × q grid, Xu et al. 2021).

The tensor group is a q × q grid (``parallel.tensor = dict(size=q*q, mode="2d")``): rank
``(i, j)`` has column-axis coordinate ``i`` (``tensor_col``, Colossal-AI's ``PARALLEL_2D_COL``
local rank) and row-axis coordinate ``j`` (``tensor_row``). Between layers an activation
``X [batch, ..., hidden]`` stays split both ways: rank ``(i, j)`` holds the batch block ``i``
and the hidden block ``j``, ``[batch/q, ..., hidden/q]``; nothing is gathered back.

=================================  ========================================================
layer                              this rank's parameters and what crosses the grid
=================================  ========================================================
:class:`Linear2D`                  ``W[out/q (block j), in/q (block i)]``; SUMMA: q steps,
                                   each broadcasting an input block along the row and a
                                   weight block along the column (backward: 2q broadcasts
                                   and 2q reduces); bias ``[out/q]`` (block j)
:class:`LayerNorm2D`               weight, bias ``[hidden/q]``; the mean and variance summed
                                   along the row
:class:`Embedding2D`               ``[vocab, dim/q]``; the token ids split by batch
:class:`VocabParallelEmbedding2D`  ``[vocab/q (block i), dim/q]``; reduce-scatter along the
                                   column
:class:`PatchEmbedding2D`          the convolution, class token and position embedding for
                                   ``embed/q`` channels; the images split by batch
:class:`Classifier2D`              ``[classes, hidden/q]``; logits summed along the row
                                   (``[batch/q, classes]`` on every rank of a row)
:class:`VocabParallelClassifier2D` a :class:`Linear2D` to the classes (``[batch/q, classes/q]``)
:class:`CrossEntropyLoss2D`,       the mean over the global batch (sums over the column)
:class:`VocabParallelCrossEntropyLoss2D`
=================================  ========================================================

A parameter replicated along the column (a bias, a norm's weight) sees other rows of the
batch on every rank: its gradient is summed along the column in the backward (the rows of a
2-D layer split the batch, so this is the gradient of the global batch); the SUMMA gradient of
a weight block is whole already. :mod:`ember.parallel.tensor2p5d` reuses these layers on
each depth layer of a d × q × q grid.

Every layer takes ``grid=`` (:func:`ember.parallel.grid.grid_of`); without it, the launched
layout's grid, which must be of this mode. ``state_dict()`` gives whole tensors (a
collective over the tensor group) in torch's own layout (``Linear2D.weight`` is ``[out, in]``).

Example:
    >>> # parallel = dict(tensor=dict(size=4, mode="2d")); 4 processes
    >>> fc = Linear2D(16, 32)                 # this rank: weight [16, 8], bias [16]
    >>> x = split_batch_2d(x)[..., ...]       # or let PatchEmbedding2D / Embedding2D split it
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.parallel.grid import TensorGrid
from ember.parallel.grid_layers import (
    Initializer,
    VocabClassifier,
    build_classifier,
    build_embedding,
    build_linear,
    build_norm,
    build_patch_embedding,
    check_features,
    check_image,
    correct_count,
    cross_entropy_options,
    global_mean,
    layer_norm,
    patch_forward,
    resolve_grid,
    rows_counted,
    vocab_block,
    vocab_cross_entropy,
    vocab_lookup,
)
from ember.parallel.grid_ops import grad_sum, reduce, reduce_scatter, split
from ember.parallel.summa import SummaLayer, batch_axis, summa_linear

__all__ = [
    "Accuracy2D",
    "Classifier2D",
    "CrossEntropyLoss2D",
    "Embedding2D",
    "LayerNorm2D",
    "Linear2D",
    "PatchEmbedding2D",
    "VocabParallelClassifier2D",
    "VocabParallelCrossEntropyLoss2D",
    "VocabParallelEmbedding2D",
    "reduce_by_batch_2d",
    "split_batch_2d",
]


class Linear2D(SummaLayer):
    """``y = x W^T + b`` by SUMMA on the q × q grid; input and output split ``[batch/q, ..., features/q]``.

    Args:
        in_features: the input features (divisible by q).
        out_features: the output features (divisible by q).
        bias: learn an additive bias (``[out/q]`` per rank, replicated along the column).
        dtype: the parameters' dtype.
        skip_bias_add: return ``(x W^T, b)`` instead of adding (Colossal-AI's kernel-fusion hook).
        weight_initializer: ``init(tensor, fan_in=, fan_out=)`` for the whole weight; default torch's.
        bias_initializer: likewise for the bias.
        grid: the grid (default: the launched layout's).

    Raises:
        ConfigError: a feature count q does not divide, no grid, or a grid of another mode.

    Example:
        >>> fc = Linear2D(16, 64, grid=grid)   # on 2 × 2: weight [32, 8]; x [b/2, s, 8] -> [b/2, s, 32]
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype | None = None,
        skip_bias_add: bool = False, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.skip_bias_add = skip_bias_add
        self.divisible("in_features", in_features, self.q)
        self.divisible("out_features", out_features, self.q)
        build_linear(self, in_features, out_features, bias, dtype, weight_initializer, bias_initializer,
                     self.split(tensor_col=1, tensor_row=0), self.split(tensor_row=0))  # fmt: skip

    def forward(self, x: torch.Tensor) -> Any:
        """``x [batch/q, ..., in/q]`` -> ``[batch/q, ..., out/q]`` (or ``(that, bias)`` with ``skip_bias_add``)."""
        check_features(type(self).__name__, x, self.in_features // self.q, "tensor_row", self.grid)
        out = summa_linear(x, grad_sum(self.weight, self.dep), self.row, self.col)
        if self.bias is None:
            return out
        bias = grad_sum(self.bias, self.rows)
        return (out, bias) if self.skip_bias_add else out + bias

    def extra_repr(self) -> str:
        shown = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shown}, bias={self.bias is not None}, {self.grid}"


class LayerNorm2D(SummaLayer):
    """LayerNorm over features split along the row: ``[batch/q, ..., hidden/q]`` in and out.

    Args:
        normalized_shape: the hidden size (divisible by q).
        eps: added to the variance.
        bias: learn a bias as well as the weight.
        dtype: the parameters' dtype.
        grid: the grid (default: the launched layout's).

    Example:
        >>> norm = LayerNorm2D(16, grid=grid)   # weight [8] on a 2 × 2 grid
    """

    def __init__(
        self, normalized_shape: int, eps: float = 1e-5, bias: bool = True, dtype: torch.dtype | None = None,
        grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("normalized_shape", int(normalized_shape), self.q)
        build_norm(self, normalized_shape, eps, bias, dtype, self.split(tensor_row=0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise this rank's ``[batch/q, ..., hidden/q]`` with statistics of the whole hidden."""
        check_features(type(self).__name__, x, self.normalized_shape // self.q, "tensor_row", self.grid)
        out = layer_norm(x, self.normalized_shape, self.eps, self.row) * grad_sum(self.weight, self.rows)
        return out if self.bias is None else out + grad_sum(self.bias, self.rows)


class Embedding2D(SummaLayer):
    """An embedding table ``[vocab, dim/q]`` per rank; token ids (whole batch) in,
    ``[batch/q, ..., dim/q]`` out.

    Args:
        num_embeddings: the vocabulary size.
        embedding_dim: the embedding size (divisible by q).
        padding_idx: as ``nn.Embedding``'s.
        dtype: the parameters' dtype.
        weight_initializer: ``init(tensor, fan_in=, fan_out=)``; default ``normal_``.
        *args: passed to ``F.embedding`` (``max_norm``, ...).
        grid: the grid (default: the launched layout's).
        **kwargs: passed to ``F.embedding``.
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None, *args: Any,
        grid: TensorGrid | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("embedding_dim", embedding_dim, self.q)
        split_ = self.split(tensor_row=1)
        build_embedding(
            self, num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, split_, args, kwargs
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up this rank's rows of ``ids`` (the whole batch on every rank)."""
        weight = grad_sum(self.weight, self.rows)
        return F.embedding(self.split_rows(ids), weight, self.padding_idx, *self.embed_args, **self.embed_kwargs)


class VocabParallelEmbedding2D(SummaLayer):
    """An embedding table split by vocabulary along the column and by dimension along the row:
    ``[vocab/q, dim/q]`` per rank; token ids (whole batch) in, ``[batch/q, ..., dim/q]`` out.

    Args: as :class:`Embedding2D` (``num_embeddings`` divisible by q).
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None, *args: Any,
        grid: TensorGrid | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("num_embeddings", num_embeddings, self.q)
        self.divisible("embedding_dim", embedding_dim, self.q)
        split_ = self.split(tensor_col=0, tensor_row=1)
        build_embedding(
            self, num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, split_, args, kwargs
        )
        vocab_block(self, self.grid.coord("tensor_col"), self.q)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up the ids of this rank's vocabulary block, then sum the blocks and keep this rank's rows."""
        ids = split(ids, 0, self.dep, "batch")  # 2.5-D: the depth layer's rows
        return reduce_scatter(vocab_lookup(self, ids, grad_sum(self.weight, self.dep)), 0, self.col)


class PatchEmbedding2D(SummaLayer):
    """A ViT's patch embedding: images (whole batch) in, ``[batch/q, patches + 1, embed/q]`` out
    (the class token first, then the patches, plus the position embedding).

    Args:
        img_size: the image side (or ``(height, width)``).
        patch_size: the patch side (or a pair).
        in_chans: the image channels.
        embed_size: the embedding size (divisible by q).
        flatten: must be True (the patches as a sequence).
        dtype: the parameters' dtype.
        weight_initializer: ``init(tensor, fan_in=, fan_out=)`` for the convolution's weight.
        bias_initializer: likewise for its bias.
        position_embed_initializer: likewise for the position embedding (default zeros).
        grid: the grid (default: the launched layout's).
    """

    def __init__(
        self, img_size: int | tuple[int, int], patch_size: int | tuple[int, int], in_chans: int, embed_size: int,
        flatten: bool = True, dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, position_embed_initializer: Initializer | None = None,
        grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("embed_size", embed_size, self.q)
        inits = (weight_initializer, bias_initializer, position_embed_initializer)
        build_patch_embedding(self, img_size, patch_size, in_chans, embed_size, flatten, dtype, inits,
                              self.split(tensor_row=0), self.split(tensor_row=2))  # fmt: skip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embed this rank's rows of ``images [batch, channels, height, width]``."""
        check_image(type(self).__name__, images, self.img_size)
        return patch_forward(self, self.split_rows(images), lambda p: grad_sum(p, self.rows))


class Classifier2D(SummaLayer):
    """A classification head: ``[batch/q, ..., hidden/q]`` in, ``[batch/q, ..., classes]`` out
    (the same logits on every rank of a row).

    Args:
        in_features: the hidden size (divisible by q).
        num_classes: the classes.
        weight: a parameter to share (e.g. an :class:`Embedding2D`'s ``[vocab, dim/q]`` weight),
            or None for a new one.
        bias: learn a bias (``[classes]``, on every rank).
        dtype: the parameters' dtype.
        weight_initializer: ``init(tensor, fan_in=, fan_out=)``; default torch's ``nn.Linear``'s.
        bias_initializer: likewise.
        grid: the grid (default: the launched layout's).
    """

    def __init__(
        self, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("in_features", in_features, self.q)
        build_classifier(self, in_features, num_classes, weight, bias, dtype, (weight_initializer, bias_initializer),
                         self.split(tensor_row=1), self.split())  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of this rank's rows: the row's partial products summed along the row."""
        check_features(type(self).__name__, x, self.in_features // self.q, "tensor_row", self.grid)
        logits = reduce(x @ grad_sum(self.weight, self.rows).t(), self.row)
        return logits if self.bias is None else logits + grad_sum(self.bias, self.rows)


class VocabParallelClassifier2D(VocabClassifier, Linear2D):
    """A classification head split by class: ``[batch/q, ..., hidden/q]`` in, ``[batch/q, ..., classes/q]``
    out (a :class:`Linear2D` to the classes; pair it with :class:`VocabParallelCrossEntropyLoss2D`).

    Args:
        in_features: the hidden size (divisible by q).
        num_classes: the classes (divisible by q).
        weight: must be None (sharing is :class:`Classifier2D`'s).
        bias: learn a bias.
        dtype: the parameters' dtype.
        weight_initializer: as :class:`Linear2D`'s.
        bias_initializer: as :class:`Linear2D`'s.
        grid: the grid (default: the launched layout's).
    """

    shares_with = "Classifier2D"


class CrossEntropyLoss2D(nn.Module):
    """Cross entropy of ``[batch/q, classes]`` logits (a :class:`Classifier2D`'s) against the
    whole batch's labels: the mean over the global batch, equal on every rank.

    Args:
        reduction: True for the mean; False for this rank's per-row losses.
        *args: passed to ``F.cross_entropy`` (``weight``, ...).
        grid: the grid (default: the launched layout's).
        **kwargs: passed to ``F.cross_entropy`` (``ignore_index``, ``label_smoothing``, ...).
    """

    mode = "2d"

    def __init__(self, reduction: bool = True, *args: Any, grid: TensorGrid | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.grid = resolve_grid(grid, self.mode, type(self).__name__)
        self.reduction_mean = reduction
        self.options = cross_entropy_options(type(self).__name__, args, kwargs)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of ``logits`` (this rank's rows) against ``targets`` (the whole batch)."""
        group = self.grid.group(batch_axis(self.grid))
        targets = split(targets, 0, group, "batch")
        if not self.reduction_mean:
            return F.cross_entropy(logits, targets, reduction="none", **self.options)
        total = F.cross_entropy(logits, targets, reduction="sum", **self.options)
        return global_mean(total, rows_counted(targets, self.options), group)


class VocabParallelCrossEntropyLoss2D(nn.Module):
    """Cross entropy of logits split by class (a :class:`VocabParallelClassifier2D`'s):
    ``[batch/q, classes/q]`` against the whole batch's labels; the mean over the global batch.

    Args:
        reduction: True for the mean; False for this rank's per-row losses.
        grid: the grid (default: the launched layout's).
    """

    mode = "2d"

    def __init__(self, reduction: bool = True, grid: TensorGrid | None = None) -> None:
        super().__init__()
        self.grid = resolve_grid(grid, self.mode, type(self).__name__)
        self.reduction_mean = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of this rank's rows and classes against ``targets`` (the whole batch)."""
        group = self.grid.group(batch_axis(self.grid))
        targets = split(targets, 0, group, "batch")
        rows = vocab_cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), self.grid.group("tensor_row")
        )
        if not self.reduction_mean:
            return rows.reshape(targets.shape)
        return global_mean(rows.sum(), torch.tensor(float(rows.numel()), device=rows.device), group)


class Accuracy2D(nn.Module):
    """The number of correct top-1 predictions of the whole batch, from ``[batch/q, classes]``
    logits (a :class:`Classifier2D`'s) and the whole batch's labels: what ``AccuracyHook``'s
    ``accuracy_func`` (and Colossal-AI's ``Accuracy2D``) returns.

    Args:
        grid: the grid (default: the launched layout's).

    Example:
        >>> hooks.AccuracyHook(accuracy_func=Accuracy2D())
    """

    mode = "2d"

    def __init__(self, grid: TensorGrid | None = None) -> None:
        super().__init__()
        self.grid = resolve_grid(grid, self.mode, type(self).__name__)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's count of correct predictions (the same on every rank)."""
        group = self.grid.group(batch_axis(self.grid))
        return correct_count(logits, split(targets, 0, group, "batch"), group)


def reduce_by_batch_2d(x: torch.Tensor, reduce_mean: bool = False, grid: TensorGrid | None = None) -> torch.Tensor:
    """Sum (or average) ``x`` over the ranks holding other rows of the batch (the column axis);
    every rank then holds the same value (Colossal-AI's ``reduce_by_batch_2d``)."""
    grid = resolve_grid(grid, "2d", "reduce_by_batch_2d")
    group = grid.group("tensor_col")
    out = reduce(x, group)
    return out / grid.size("tensor_col") if reduce_mean else out


def split_batch_2d(x: torch.Tensor, dim: int = 0, grid: TensorGrid | None = None) -> torch.Tensor:
    """This rank's block of ``x`` (the same on every rank of the tensor group) along ``dim``:
    split along the column axis (Colossal-AI's ``split_batch_2d``)."""
    grid = resolve_grid(grid, "2d", "split_batch_2d")
    return split(x, dim, grid.group("tensor_col"), "batch")
