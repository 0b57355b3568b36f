"""Colossal-AI's ``colossalai.nn.layer.parallel_2p5d``: :mod:`ember.parallel.tensor2p5d`'s layers.

The batch is split over depth × column (``d·q`` blocks, as the Tesseract paper and
Colossal-AI's documentation describe); Colossal-AI 0.2.8's layers split it over the column only.
"""

from __future__ import annotations

from ember.parallel.tensor2p5d import (
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

__all__ = [
    "Classifier2p5D",
    "Embedding2p5D",
    "LayerNorm2p5D",
    "Linear2p5D",
    "PatchEmbedding2p5D",
    "VocabParallelClassifier2p5D",
    "VocabParallelEmbedding2p5D",
    "reduce_by_batch_2p5d",
    "split_batch_2p5d",
]
