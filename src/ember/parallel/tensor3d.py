"""3-D tensor parallelism (Bian et al. 2021) on a q × q × q cube.

``parallel.tensor = dict(size=q**3, mode="3d")``. The cube's axes are ``tensor_output``,
``tensor_input`` and ``tensor_weight`` (Colossal-AI's ``PARALLEL_3D_OUTPUT/INPUT/WEIGHT``).
A layer sees them in two roles, *input* and *output*: an activation entering a layer is split
``[batch/q², ..., hidden/q]`` — its rows over weight × input (weight outer), its features over
output. :class:`Linear3D`, for ``y = x W^T``:

1. all-gathers ``x`` over the input axis (``[batch/q, ..., in/q]``) and its weight block
   ``[out/q, in/q²]`` over the weight axis (``[out/q, in/q]``);
2. multiplies, a partial sum over the in-blocks;
3. reduce-scatters the product over the output axis: ``[batch/q², ..., out/q]``.

Its output has rows over weight × output and features over input: the roles of input and
output swap for the next layer. Each :class:`Linear3D` flips its grid's roles when it is
built (:attr:`~ember.parallel.grid.TensorGrid.flipped`), as Colossal-AI's ``swap_in_out_group``
does: **build the layers in the order the activations flow through them** (a transformer
block, with its fused qkv, proj, fc1 and fc2, flips four times and ends where it began). Layers
that keep the layout (:class:`LayerNorm3D`, :class:`Classifier3D`, the embeddings, the losses)
read the roles when built and flip nothing.

Parameters: a Linear's weight ``[out/q (input role), in/q² (output × weight)]``, its bias
``[out/q]`` (summed over output × weight in the backward); norms, embeddings and classifier
weights ``[.../q]`` along the output role, their gradients summed over input × weight (the ranks
holding other rows).

Example:
    >>> # parallel = dict(tensor=dict(size=8, mode="3d")); 8 processes
    >>> fc1, fc2 = Linear3D(16, 64), Linear3D(64, 16)   # x [b/4, s, 8] -> [b/4, s, 32] -> [b/4, s, 8]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.parallel.grid import GridLayer, TensorGrid
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
    divisible,
    global_mean,
    layer_norm,
    patch_forward,
    resolve_grid,
    rows_counted,
    vocab_block,
    vocab_cross_entropy,
    vocab_lookup,
)
from ember.parallel.grid_ops import gather, grad_sum, reduce, reduce_scatter, split

__all__ = [
    "Accuracy3D",
    "Classifier3D",
    "CrossEntropyLoss3D",
    "Embedding3D",
    "LayerNorm3D",
    "Linear3D",
    "PatchEmbedding3D",
    "VocabParallelClassifier3D",
    "VocabParallelCrossEntropyLoss3D",
    "VocabParallelEmbedding3D",
    "reduce_by_batch_3d",
    "split_batch_3d",
]

_ROLES = {
    False: ("tensor_input", "tensor_output", "tensor_input_x_weight", "tensor_output_x_weight"),
    True: ("tensor_output", "tensor_input", "tensor_output_x_weight", "tensor_input_x_weight"),
}


class _Roles:
    """The axes of a 3-D grid in the roles a layer sees them, fixed when it is built."""

    def __init__(self, grid: TensorGrid) -> None:
        self.grid = grid
        self.input, self.output, self.input_x_weight, self.output_x_weight = _ROLES[grid.flipped]

    def group(self, name: str) -> Any:
        return self.grid.group(getattr(self, name) if name != "weight" else "tensor_weight")

    def split_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a batch every rank holds whole: over weight, then input."""
        x = split(x, 0, self.grid.group("tensor_weight"), "batch")
        return split(x, 0, self.group("input"), "batch")


class _Cube(GridLayer):
    mode = "3d"

    def __init__(self, grid: TensorGrid | None) -> None:
        super().__init__(resolve_grid(grid, self.mode, type(self).__name__))
        self.q = self.grid.q
        self.roles = _Roles(self.grid)
        self.input_axis, self.output_axis = self.roles.input, self.roles.output

    def split(self, **roles: int) -> tuple[int | None, ...]:
        """The split tuple of a parameter, given by role (``input=0, output=1, weight=1``)."""
        by_axis = {("tensor_weight" if r == "weight" else getattr(self.roles, r)): d for r, d in roles.items()}
        return tuple(by_axis.get(axis) for axis in self.grid.axes)

    def divisible(self, what: str, value: int, by: int) -> None:
        divisible(type(self).__name__, what, value, by, self.grid)


def _amp_cast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the autocast dtype when autocast is on (so the gathered blocks are half the bytes)."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype == torch.float32:
        return x.to(torch.get_autocast_dtype(device))
    return x


class Linear3D(_Cube):
    """``y = x W^T + b`` on the cube: all-gather, multiply, reduce-scatter; flips the grid's roles.

    Args:
        in_features: divisible by q².
        out_features: divisible by q.
        bias: learn an additive bias (``[out/q]``).
        dtype: the parameters' dtype.
        skip_bias_add: return ``(x W^T, b)`` instead of adding.
        weight_initializer: ``init(tensor, fan_in=, fan_out=)`` for the whole weight; default torch's.
        bias_initializer: likewise for the bias.
        grid: the grid (default: the launched layout's).

    Example:
        >>> fc = Linear3D(16, 64, grid=grid)   # on 2 × 2 × 2: weight [32, 4]
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype | None = None,
        skip_bias_add: bool = False, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.skip_bias_add = skip_bias_add
        self.divisible("in_features", in_features, self.q * self.q)
        self.divisible("out_features", out_features, self.q)
        build_linear(self, in_features, out_features, bias, dtype, weight_initializer, bias_initializer,
                     self.split(input=0, output=1, weight=1), self.split(input=0))  # fmt: skip
        self.grid.flipped = not self.grid.flipped

    def forward(self, x: torch.Tensor) -> Any:
        """``x [batch/q², ..., in/q]`` -> ``[batch/q², ..., out/q]`` (the roles swapped)."""
        check_features(type(self).__name__, x, self.in_features // self.q, self.output_axis, self.grid)
        r = self.roles
        x = gather(_amp_cast(x), 0, r.group("input"))
        w = gather(_amp_cast(self.weight), 1, r.group("weight"))
        out = reduce_scatter(x @ w.t(), 0, r.group("output"))
        if self.bias is None:
            return out
        bias = grad_sum(self.bias, r.group("output_x_weight"))
        return (out, bias) if self.skip_bias_add else out + bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"input={self.input_axis}, output={self.output_axis}"
        )


class LayerNorm3D(_Cube):
    """LayerNorm over features split along the output role: ``[batch/q², ..., hidden/q]`` in and out.

    Args:
        normalized_shape: the hidden size (divisible by q).
        eps: added to the variance.
        bias: learn a bias as well as the weight.
        dtype: the parameters' dtype.
        grid: the grid (default: the launched layout's).
    """

    def __init__(
        self, normalized_shape: int, eps: float = 1e-5, bias: bool = True, dtype: torch.dtype | None = None,
        grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("normalized_shape", int(normalized_shape), self.q)
        build_norm(self, normalized_shape, eps, bias, dtype, self.split(output=0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise with statistics summed along the output role."""
        check_features(type(self).__name__, x, self.normalized_shape // self.q, self.output_axis, self.grid)
        r = self.roles
        out = layer_norm(x, self.normalized_shape, self.eps, r.group("output"))
        out = out * grad_sum(self.weight, r.group("input_x_weight"))
        return out if self.bias is None else out + grad_sum(self.bias, r.group("input_x_weight"))


class Embedding3D(_Cube):
    """An embedding table ``[vocab, dim/q]`` (the output role's block); token ids (whole batch)
    in, ``[batch/q², ..., dim/q]`` out.

    Args: as :class:`~ember.parallel.tensor2d.Embedding2D` (``embedding_dim`` divisible by q).
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None, *args: Any,
        grid: TensorGrid | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("embedding_dim", embedding_dim, self.q)
        split_ = self.split(output=1)
        build_embedding(self, num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, split_, args,
                        kwargs)  # fmt: skip

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up this rank's rows of ``ids``."""
        weight = grad_sum(self.weight, self.roles.group("input_x_weight"))
        return F.embedding(self.roles.split_rows(ids), weight, self.padding_idx, *self.embed_args, **self.embed_kwargs)


class VocabParallelEmbedding3D(_Cube):
    """An embedding table ``[vocab/q (input role), dim/q (output role)]``; token ids (whole
    batch) in, ``[batch/q², ..., dim/q]`` out (partial lookups reduce-scattered over the input role).

    Args: as :class:`~ember.parallel.tensor2d.Embedding2D` (``num_embeddings`` and
    ``embedding_dim`` divisible by q).
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None, *args: Any,
        grid: TensorGrid | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("num_embeddings", num_embeddings, self.q)
        self.divisible("embedding_dim", embedding_dim, self.q)
        split_ = self.split(input=0, output=1)
        build_embedding(self, num_embeddings, embedding_dim, padding_idx, dtype, weight_initializer, split_, args,
                        kwargs)  # fmt: skip
        vocab_block(self, self.grid.coord(self.input_axis), self.q)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up this rank's vocabulary block for its weight-axis rows, sum over the input role."""
        r = self.roles
        ids = split(ids, 0, r.group("weight"), "batch")
        return reduce_scatter(vocab_lookup(self, ids, grad_sum(self.weight, r.group("weight"))), 0, r.group("input"))


class PatchEmbedding3D(_Cube):
    """A ViT's patch embedding: images (whole batch) in, ``[batch/q², patches + 1, embed/q]`` out.

    Args: as :class:`~ember.parallel.tensor2d.PatchEmbedding2D` (``embed_size`` divisible by q).
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
                              self.split(output=0), self.split(output=2))  # fmt: skip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Embed this rank's rows of ``images [batch, channels, height, width]``."""
        check_image(type(self).__name__, images, self.img_size)
        group = self.roles.group("input_x_weight")
        return patch_forward(self, self.roles.split_rows(images), lambda p: grad_sum(p, group))


class Classifier3D(_Cube):
    """A classification head: ``[batch/q², ..., hidden/q]`` in, ``[batch/q², ..., classes]`` out
    (summed over the output role: the same logits on its q ranks).

    Args: as :class:`~ember.parallel.tensor2d.Classifier2D`.
    """

    def __init__(
        self, in_features: int, num_classes: int, weight: nn.Parameter | None = None, bias: bool = True,
        dtype: torch.dtype | None = None, weight_initializer: Initializer | None = None,
        bias_initializer: Initializer | None = None, grid: TensorGrid | None = None,
    ) -> None:  # fmt: skip
        super().__init__(grid)
        self.divisible("in_features", in_features, self.q)
        build_classifier(self, in_features, num_classes, weight, bias, dtype, (weight_initializer, bias_initializer),
                         self.split(output=1), self.split())  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of this rank's rows."""
        check_features(type(self).__name__, x, self.in_features // self.q, self.output_axis, self.grid)
        g = self.roles.group("input_x_weight")
        logits = reduce(x @ grad_sum(self.weight, g).t(), self.roles.group("output"))
        return logits if self.bias is None else logits + grad_sum(self.bias, g)


class VocabParallelClassifier3D(VocabClassifier, Linear3D):
    """A classification head split by class: a :class:`Linear3D` to the classes (it flips the roles).

    Args: as :class:`Linear3D`, with ``num_classes`` for ``out_features``; ``weight`` must be None.
    """

    shares_with = "Classifier3D"


class CrossEntropyLoss3D(nn.Module):
    """Cross entropy of ``[batch/q², classes]`` logits (a :class:`Classifier3D`'s) against the
    whole batch's labels: the mean over the global batch.

    Args: as :class:`~ember.parallel.tensor2d.CrossEntropyLoss2D`.
    """

    def __init__(self, reduction: bool = True, *args: Any, grid: TensorGrid | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.grid = resolve_grid(grid, "3d", type(self).__name__)
        self.roles = _Roles(self.grid)
        self.reduction_mean = reduction
        self.options = cross_entropy_options(type(self).__name__, args, kwargs)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of this rank's rows against ``targets`` (the whole batch)."""
        targets = self.roles.split_rows(targets)
        if not self.reduction_mean:
            return F.cross_entropy(logits, targets, reduction="none", **self.options)
        total = F.cross_entropy(logits, targets, reduction="sum", **self.options)
        counted = rows_counted(targets, self.options)
        return global_mean(total, counted, self.roles.group("input_x_weight"))


class VocabParallelCrossEntropyLoss3D(nn.Module):
    """Cross entropy of logits split by class (a :class:`VocabParallelClassifier3D`'s): the mean
    over the global batch.

    Args: as :class:`~ember.parallel.tensor2d.VocabParallelCrossEntropyLoss2D`.
    """

    def __init__(self, reduction: bool = True, grid: TensorGrid | None = None) -> None:
        super().__init__()
        self.grid = resolve_grid(grid, "3d", type(self).__name__)
        self.roles = _Roles(self.grid)
        self.reduction_mean = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of this rank's rows and classes against ``targets`` (the whole batch)."""
        targets = self.roles.split_rows(targets)
        rows = vocab_cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), self.roles.group("output")
        )
        if not self.reduction_mean:
            return rows.reshape(targets.shape)
        count = torch.tensor(float(rows.numel()), device=rows.device)
        return global_mean(rows.sum(), count, self.roles.group("input_x_weight"))


class Accuracy3D(nn.Module):
    """The number of correct top-1 predictions of the whole batch, from ``[batch/q², classes]``
    logits (a :class:`Classifier3D`'s) and the whole batch's labels (see
    :class:`~ember.parallel.tensor2d.Accuracy2D`).

    Args:
        grid: the grid (default: the launched layout's).
    """

    def __init__(self, grid: TensorGrid | None = None) -> None:
        super().__init__()
        self.roles = _Roles(resolve_grid(grid, "3d", type(self).__name__))

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's count of correct predictions (the same on every rank)."""
        return correct_count(logits, self.roles.split_rows(targets), self.roles.group("input_x_weight"))


def reduce_by_batch_3d(x: torch.Tensor, reduce_mean: bool = False, grid: TensorGrid | None = None) -> torch.Tensor:
    """Sum (or average) ``x`` over the ranks holding other rows of the batch (input × weight in
    the roles the next layer built sees); every rank then holds the same value."""
    roles = _Roles(resolve_grid(grid, "3d", "reduce_by_batch_3d"))
    out = reduce(x, roles.group("input_x_weight"))
    return out / roles.grid.size(roles.input_x_weight) if reduce_mean else out


def split_batch_3d(x: torch.Tensor, dim: int = 0, grid: TensorGrid | None = None) -> torch.Tensor:
    """This rank's block of ``x`` along ``dim``: split over the weight axis, then the input
    role (Colossal-AI's ``split_batch_3d``), for the layout the next layer built takes."""
    roles = _Roles(resolve_grid(grid, "3d", "split_batch_3d"))
    x = split(x, dim, roles.grid.group("tensor_weight"), "batch")
    return split(x, dim, roles.group("input"), "batch")
