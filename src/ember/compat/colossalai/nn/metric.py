"""Colossal-AI's ``colossalai.nn.metric``: ``Accuracy``, the count of correct predictions.

It counts with ember's :func:`ember.trainer.hooks.metrics.topk_correct` (top-1), the function
``AccuracyHook`` uses by default, so ``hooks.AccuracyHook(accuracy_func=Accuracy())`` records
the same ``test/accuracy`` as ``hooks.AccuracyHook()``. Built under a launched 2-D, 2.5-D or
3-D tensor mode it is that mode's ``Accuracy2D`` / ``Accuracy2p5D`` / ``Accuracy3D`` (also here
by name), which counts this rank's rows of the batch against their labels and sums the counts
over the ranks holding the other rows, as Colossal-AI's ``Accuracy`` does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember import context as _context
from ember.parallel.tensor2d import Accuracy2D
from ember.parallel.tensor2p5d import Accuracy2p5D
from ember.parallel.tensor3d import Accuracy3D
from ember.trainer.hooks.metrics import topk_correct

__all__ = ["Accuracy", "Accuracy2D", "Accuracy2p5D", "Accuracy3D"]

_BY_MODE: dict[str, Any] = {"2d": Accuracy2D, "2.5d": Accuracy2p5D, "3d": Accuracy3D}


class Accuracy(nn.Module):
    """How many rows of ``logits`` (N, C) have their largest score at ``targets`` (N,).

    Returns the number of correct predictions in the batch (a 0-dim tensor), not a ratio:
    ``AccuracyHook`` divides the sum over the epoch and the ranks by the number of samples.

    Example:
        >>> Accuracy()(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(1)
    """

    def __new__(cls) -> nn.Module:  # type: ignore[misc]
        config = _context.get_context().config if _context.is_launched() else None
        mode = config.parallel.tensor.mode if config is not None else None
        if mode in _BY_MODE:
            return _BY_MODE[mode]()
        return super().__new__(cls)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The number of correct predictions in the batch."""
        return topk_correct(logits, targets, 1)
