"""Colossal-AI's ``colossalai.nn.layer.parallel_3d``: :mod:`ember.parallel.tensor3d`'s layers.

As Colossal-AI's, each ``Linear3D`` swaps the roles of the input and output groups for the
layers built after it: build them in the order activations flow through them.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.parallel.grid_ops import split
from ember.parallel.tensor3d import (
    Classifier3D,
    Embedding3D,
    LayerNorm3D,
    Linear3D,
    PatchEmbedding3D,
    VocabParallelClassifier3D,
    VocabParallelEmbedding3D,
    reduce_by_batch_3d,
    split_batch_3d,
)

from ...context import ParallelMode
from ...core import global_context as gpc

__all__ = [
    "Classifier3D",
    "Embedding3D",
    "LayerNorm3D",
    "Linear3D",
    "PatchEmbedding3D",
    "VocabParallelClassifier3D",
    "VocabParallelEmbedding3D",
    "reduce_by_batch_3d",
    "split_batch_3d",
    "split_tensor_3d",
]


def split_tensor_3d(tensor: torch.Tensor, dim: int, parallel_mode: ParallelMode | Any) -> torch.Tensor:
    """This rank's chunk of ``tensor`` along ``dim`` over ``parallel_mode``'s group (the backward
    gathers the chunks' gradients).

    Example:
        >>> x = split_tensor_3d(x, 0, ParallelMode.PARALLEL_3D_WEIGHT)
    """
    return split(tensor, dim, gpc.get_group(parallel_mode))
