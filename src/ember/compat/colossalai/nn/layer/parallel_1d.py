"""Colossal-AI's ``colossalai.nn.layer.parallel_1d``: :mod:`ember.parallel.tensor1d`'s layers.

``Linear1D`` is a function that returns a :class:`Linear1D_Col` or a :class:`Linear1D_Row`
(Colossal-AI's is a wrapper module around one of them).
"""

from __future__ import annotations

from ember.parallel.tensor1d import (
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
    "VocabParallelEmbedding1D",
]
