"""Colossal-AI's ``colossalai.nn.layer``: the mode-dispatching layers and each mode's.

``colossalai.nn.layer.parallel_1d`` / ``parallel_2d`` / ``parallel_2p5d`` / ``parallel_3d`` hold
the layers of one tensor mode (ember's :mod:`ember.parallel.tensor1d` …
:mod:`~ember.parallel.tensor3d`), ``vanilla`` the one-process ones, and ``colossalai_layer``
the layers that pick the launched mode's (``Linear``, ``Classifier``, ``Embedding``,
``PatchEmbedding``, ``LayerNorm``, ``Dropout``).
"""

from __future__ import annotations

from .colossalai_layer import Classifier, Dropout, Embedding, LayerNorm, Linear, PatchEmbedding, partition_batch
from .parallel_1d import (
    Classifier1D,
    Dropout1D,
    Embedding1D,
    LayerNorm1D,
    Linear1D,
    Linear1D_Col,
    Linear1D_Row,
    PatchEmbedding1D,
    VocabParallelClassifier1D,
    VocabParallelEmbedding1D,
)
from .parallel_2d import (
    Classifier2D,
    Embedding2D,
    LayerNorm2D,
    Linear2D,
    PatchEmbedding2D,
    VocabParallelClassifier2D,
    VocabParallelEmbedding2D,
    reduce_by_batch_2d,
    split_batch_2d,
)
from .parallel_2p5d import (
    Classifier2p5D,
    Embedding2p5D,
    LayerNorm2p5D,
    Linear2p5D,
    PatchEmbedding2p5D,
    VocabParallelClassifier2p5D,
    VocabParallelEmbedding2p5D,
    reduce_by_batch_2p5d,
    split_batch_2p5d,
)
from .parallel_3d import (
    Classifier3D,
    Embedding3D,
    LayerNorm3D,
    Linear3D,
    PatchEmbedding3D,
    VocabParallelClassifier3D,
    VocabParallelEmbedding3D,
    reduce_by_batch_3d,
    split_batch_3d,
    split_tensor_3d,
)
from .vanilla import VanillaClassifier, VanillaLayerNorm, VanillaLinear, VanillaPatchEmbedding

__all__ = [
    "Classifier",
    "Classifier1D",
    "Classifier2D",
    "Classifier2p5D",
    "Classifier3D",
    "Dropout",
    "Dropout1D",
    "Embedding",
    "Embedding1D",
    "Embedding2D",
    "Embedding2p5D",
    "Embedding3D",
    "LayerNorm",
    "LayerNorm1D",
    "LayerNorm2D",
    "LayerNorm2p5D",
    "LayerNorm3D",
    "Linear",
    "Linear1D",
    "Linear1D_Col",
    "Linear1D_Row",
    "Linear2D",
    "Linear2p5D",
    "Linear3D",
    "PatchEmbedding",
    "PatchEmbedding1D",
    "PatchEmbedding2D",
    "PatchEmbedding2p5D",
    "PatchEmbedding3D",
    "VanillaClassifier",
    "VanillaLayerNorm",
    "VanillaLinear",
    "VanillaPatchEmbedding",
    "VocabParallelClassifier1D",
    "VocabParallelClassifier2D",
    "VocabParallelClassifier2p5D",
    "VocabParallelClassifier3D",
    "VocabParallelEmbedding1D",
    "VocabParallelEmbedding2D",
    "VocabParallelEmbedding2p5D",
    "VocabParallelEmbedding3D",
    "partition_batch",
    "reduce_by_batch_2d",
    "reduce_by_batch_2p5d",
    "reduce_by_batch_3d",
    "split_batch_2d",
    "split_batch_2p5d",
    "split_batch_3d",
    "split_tensor_3d",
]  # fmt: skip
