"""Colossal-AI's ``colossalai.nn.layer``: the mode-dispatching layers and each mode's.

``colossalai.nn.layer.parallel_1d`` / ``parallel_2d`` / ``parallel_2p5d`` / ``parallel_3d`` hold
the layers of one tensor mode (ember's :mod:`ember.parallel.tensor1d` …
:mod:`~ember.parallel.tensor3d`), ``vanilla`` the one-process ones, and ``colossalai_layer``
the layers that pick the launched mode's (``Linear``, ``Classifier``, ``Embedding``,
``PatchEmbedding``, ``LayerNorm``, ``Dropout``). Imported by their paths: ``parallel_sequence``,
ring self-attention on ember's context parallelism, and ``moe``, mixture of experts on ember's
expert parallelism.
"""

from __future__ import annotations

from . import colossalai_layer, parallel_1d, parallel_2d, parallel_2p5d, parallel_3d, vanilla
from .colossalai_layer import *  # noqa: F403 - Colossal-AI's namespace: every layer of every mode
from .parallel_1d import *  # noqa: F403
from .parallel_2d import *  # noqa: F403
from .parallel_2p5d import *  # noqa: F403
from .parallel_3d import *  # noqa: F403
from .vanilla import *  # noqa: F403

__all__ = [
    name
    for module in (colossalai_layer, parallel_1d, parallel_2d, parallel_2p5d, parallel_3d, vanilla)
    for name in module.__all__
]
