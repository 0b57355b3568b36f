"""Colossal-AI's ``colossalai.nn.layer.parallel_2d``: :mod:`ember.parallel.tensor2d`'s layers.

Weights are in torch's layout (``Linear2D.weight`` is this rank's ``[out/q, in/q]`` block of
``[out, in]``; Colossal-AI keeps the transpose), and biases and norms hold ``[features/q]``
blocks replicated along the column (Colossal-AI splits them q² ways and all-gathers them in
every forward). ``state_dict()`` gives whole tensors either way.
"""

from __future__ import annotations

from ember.parallel.tensor2d import (
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

__all__ = [
    "Classifier2D",
    "Embedding2D",
    "LayerNorm2D",
    "Linear2D",
    "PatchEmbedding2D",
    "VocabParallelClassifier2D",
    "VocabParallelEmbedding2D",
    "reduce_by_batch_2d",
    "split_batch_2d",
]
