"""Colossal-AI's ``colossalai.nn.loss``: ``CrossEntropyLoss`` dispatching on the tensor mode,
and each mode's cross-entropy losses.

``CrossEntropyLoss(reduction=True, *args, **kwargs)`` is torch's ``nn.CrossEntropyLoss`` with
no tensor mode or under 1-D; the vocabulary-parallel loss of the mode once a
vocabulary-parallel ``Embedding``/``Classifier`` was built; else ``CrossEntropyLoss2D``,
``CrossEntropyLoss2p5D`` or ``CrossEntropyLoss3D`` (the mean over the global batch from each
rank's rows). ``reduction`` is Colossal-AI's boolean (True: the mean; False: per-sample losses).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ember.parallel.tensor1d import VocabParallelCrossEntropyLoss1D
from ember.parallel.tensor2d import CrossEntropyLoss2D, VocabParallelCrossEntropyLoss2D
from ember.parallel.tensor2p5d import CrossEntropyLoss2p5D, VocabParallelCrossEntropyLoss2p5D
from ember.parallel.tensor3d import CrossEntropyLoss3D, VocabParallelCrossEntropyLoss3D

from .layer.colossalai_layer import tensor_mode, vocab_parallel_built

__all__ = [
    "CrossEntropyLoss",
    "CrossEntropyLoss2D",
    "CrossEntropyLoss2p5D",
    "CrossEntropyLoss3D",
    "VocabParallelCrossEntropyLoss1D",
    "VocabParallelCrossEntropyLoss2D",
    "VocabParallelCrossEntropyLoss2p5D",
    "VocabParallelCrossEntropyLoss3D",
]

_PARALLEL = {"2d": CrossEntropyLoss2D, "2.5d": CrossEntropyLoss2p5D, "3d": CrossEntropyLoss3D}
_VOCAB_PARALLEL = {
    "1d": VocabParallelCrossEntropyLoss1D, "2d": VocabParallelCrossEntropyLoss2D,
    "2.5d": VocabParallelCrossEntropyLoss2p5D, "3d": VocabParallelCrossEntropyLoss3D,
}  # fmt: skip


class CrossEntropyLoss(nn.Module):
    """The launched tensor mode's cross entropy (see the module's docstring).

    Args:
        reduction: True for the mean over the (global) batch; False for per-sample losses.
        *args: torch's ``F.cross_entropy`` options after the target (``weight``, ...).
        **kwargs: likewise by name (``ignore_index``, ``label_smoothing``).

    Example:
        >>> criterion = colossalai.nn.CrossEntropyLoss()   # CrossEntropyLoss2D under mode '2d'
    """

    def __new__(cls, reduction: bool = True, *args: Any, **kwargs: Any) -> nn.Module:  # type: ignore[misc]
        mode = tensor_mode("CrossEntropyLoss")
        if mode is not None and vocab_parallel_built():
            return _VOCAB_PARALLEL[mode](reduction)
        if mode is None or mode == "1d":
            options = dict(zip(("weight", "size_average", "ignore_index", "reduce"), args, strict=False))
            return nn.CrossEntropyLoss(**options, reduction="mean" if reduction else "none", **kwargs)
        return _PARALLEL[mode](reduction, *args, **kwargs)
