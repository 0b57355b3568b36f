"""Colossal-AI's ``colossalai.nn``: its layers and losses, learning-rate schedulers, accuracy metric and optimizers.

``colossalai.nn.Linear``, ``LayerNorm``, ``Embedding``, ``PatchEmbedding``, ``Classifier``,
``Dropout`` and ``CrossEntropyLoss`` build the launched ``parallel.tensor.mode``'s layers
(:mod:`.layer`, :mod:`.loss`); each mode's own classes (``Linear2D``, ``Linear2p5D``,
``Linear3D``, ...) are here too, and under ``colossalai.nn.layer.parallel_2d`` & co.; so is
``Accuracy`` (:mod:`.metric`).
"""

from __future__ import annotations

from . import layer, loss, lr_scheduler, metric, optimizer
from .layer import *  # noqa: F403 - Colossal-AI's namespace: every layer of every mode
from .loss import *  # noqa: F403
from .metric import *  # noqa: F403 - colossalai.nn.Accuracy, as Colossal-AI's nn re-exports its metrics
from .optimizer import FusedAdam, FusedLAMB, FusedSGD, Lamb

__all__ = [
    "FusedAdam", "FusedLAMB", "FusedSGD", "Lamb", "layer", "loss", "lr_scheduler", "metric", "optimizer",
    *layer.__all__, *loss.__all__, *metric.__all__,
]  # fmt: skip
