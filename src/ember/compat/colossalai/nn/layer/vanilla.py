"""Colossal-AI's ``colossalai.nn.layer.vanilla``: the one-process layers.

``VanillaLinear`` and ``VanillaLayerNorm`` are torch's ``nn.Linear`` and ``nn.LayerNorm``;
``VanillaPatchEmbedding`` and ``VanillaClassifier`` are :mod:`ember.parallel.vanilla`'s.
"""

from __future__ import annotations

from torch.nn import LayerNorm as VanillaLayerNorm
from torch.nn import Linear as VanillaLinear

from ember.parallel.vanilla import VanillaClassifier, VanillaPatchEmbedding

__all__ = ["VanillaClassifier", "VanillaLayerNorm", "VanillaLinear", "VanillaPatchEmbedding"]
