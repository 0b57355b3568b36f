"""2.5-D tensor parallelism (Tesseract, Wang et al. 2021): d layers of a q × q SUMMA grid.

``parallel.tensor = dict(size=d*q*q, mode="2.5d", depth=d)``. Rank ``(k, i, j)`` has depth
``k`` (``tensor_dep``), column ``i`` and row ``j``. The batch is split into ``d·q`` blocks over
depth × column (``tensor_xz``, block ``k·q + i``), the features into ``q`` blocks over the
row: an activation is ``[batch/(d·q), ..., hidden/q]``. Each depth layer multiplies its own
rows by SUMMA exactly as :mod:`ember.parallel.tensor2d` does; the weight blocks
``[out/q, in/q]`` are the same on every layer (the memory of 2-D, the activations and compute
of ``d·q²`` ranks), so their gradients are summed over the depth, and a parameter replicated
along the column (biases, norms, classifier weights) sums its gradient over depth × column.

The classes are :mod:`~ember.parallel.tensor2d`'s on a 2.5-D grid (one implementation of
SUMMA): the depth and the depth × column groups come from the grid.

Unlike Colossal-AI 0.2.8 — whose 2.5-D layers split the batch over the column only, so the
``d`` layers computed the same rows — the batch is split over depth × column as the paper and
Colossal-AI's own documentation describe: the depth divides the work.

Example:
    >>> # parallel = dict(tensor=dict(size=8, mode="2.5d", depth=2)); 8 processes
    >>> fc = Linear2p5D(16, 64)     # weight [32, 8]; x [b/4, s, 8] -> [b/4, s, 32]
"""

from __future__ import annotations

import torch

from ember.parallel.grid import TensorGrid
from ember.parallel.grid_layers import resolve_grid
from ember.parallel.grid_ops import reduce, split
from ember.parallel.tensor2d import (
    Accuracy2D,
    Classifier2D,
    CrossEntropyLoss2D,
    Embedding2D,
    LayerNorm2D,
    Linear2D,
    PatchEmbedding2D,
    VocabParallelClassifier2D,
    VocabParallelCrossEntropyLoss2D,
    VocabParallelEmbedding2D,
)

__all__ = [
    "Accuracy2p5D",
    "Classifier2p5D",
    "CrossEntropyLoss2p5D",
    "Embedding2p5D",
    "LayerNorm2p5D",
    "Linear2p5D",
    "PatchEmbedding2p5D",
    "VocabParallelClassifier2p5D",
    "VocabParallelCrossEntropyLoss2p5D",
    "VocabParallelEmbedding2p5D",
    "reduce_by_batch_2p5d",
    "split_batch_2p5d",
]


class Linear2p5D(Linear2D):
    """:class:`~ember.parallel.tensor2d.Linear2D` on each depth layer; weight gradients summed over the depth."""

    mode = "2.5d"


class LayerNorm2p5D(LayerNorm2D):
    """:class:`~ember.parallel.tensor2d.LayerNorm2D` on ``[batch/(d·q), ..., hidden/q]``."""

    mode = "2.5d"


class Embedding2p5D(Embedding2D):
    """:class:`~ember.parallel.tensor2d.Embedding2D`; the ids split over depth × column."""

    mode = "2.5d"


class VocabParallelEmbedding2p5D(VocabParallelEmbedding2D):
    """:class:`~ember.parallel.tensor2d.VocabParallelEmbedding2D` on each depth layer's rows."""

    mode = "2.5d"


class PatchEmbedding2p5D(PatchEmbedding2D):
    """:class:`~ember.parallel.tensor2d.PatchEmbedding2D`; the images split over depth × column."""

    mode = "2.5d"


class Classifier2p5D(Classifier2D):
    """:class:`~ember.parallel.tensor2d.Classifier2D`: ``[batch/(d·q), classes]`` logits."""

    mode = "2.5d"


class VocabParallelClassifier2p5D(VocabParallelClassifier2D):
    """:class:`~ember.parallel.tensor2d.VocabParallelClassifier2D`: ``[batch/(d·q), classes/q]`` logits."""

    mode = "2.5d"


class Accuracy2p5D(Accuracy2D):
    """:class:`~ember.parallel.tensor2d.Accuracy2D` over the batch's ``d·q`` blocks."""

    mode = "2.5d"


class CrossEntropyLoss2p5D(CrossEntropyLoss2D):
    """:class:`~ember.parallel.tensor2d.CrossEntropyLoss2D`: the mean over depth × column."""

    mode = "2.5d"


class VocabParallelCrossEntropyLoss2p5D(VocabParallelCrossEntropyLoss2D):
    """:class:`~ember.parallel.tensor2d.VocabParallelCrossEntropyLoss2D` on a 2.5-D grid."""

    mode = "2.5d"


def reduce_by_batch_2p5d(x: torch.Tensor, reduce_mean: bool = False, grid: TensorGrid | None = None) -> torch.Tensor:
    """Sum (or average) ``x`` over the ranks holding other rows of the batch (depth × column);
    every rank then holds the same value (Colossal-AI's ``reduce_by_batch_2p5d``, over the
    batch's ``d·q`` blocks here)."""
    grid = resolve_grid(grid, "2.5d", "reduce_by_batch_2p5d")
    out = reduce(x, grid.group("tensor_xz"))
    return out / grid.size("tensor_xz") if reduce_mean else out


def split_batch_2p5d(x: torch.Tensor, dim: int = 0, grid: TensorGrid | None = None) -> torch.Tensor:
    """This rank's block of ``x`` (the same on every rank of the tensor group) along ``dim``:
    split over depth × column, block ``k·q + i`` (Colossal-AI's ``split_batch_2p5d`` splits
    over the column only; see the module's note)."""
    grid = resolve_grid(grid, "2.5d", "split_batch_2p5d")
    return split(x, dim, grid.group("tensor_xz"), "batch")
