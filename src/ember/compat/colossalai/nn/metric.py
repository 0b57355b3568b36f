"""Colossal-AI's ``colossalai.nn.metric``: ``Accuracy``, the count of correct predictions.

It counts with ember's :func:`ember.trainer.hooks.metrics.topk_correct` (top-1), the function
``AccuracyHook`` uses by default, so ``hooks.AccuracyHook(accuracy_func=Accuracy())`` records
the same ``test/accuracy`` as ``hooks.AccuracyHook()``.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.trainer.hooks.metrics import topk_correct

__all__ = ["Accuracy"]


class Accuracy(nn.Module):
    """How many rows of ``logits`` (N, C) have their largest score at ``targets`` (N,).

    Returns the number of correct predictions in the batch (a 0-dim tensor), not a ratio:
    ``AccuracyHook`` divides the sum over the epoch and the ranks by the number of samples.

    Example:
        >>> Accuracy()(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
        tensor(1)
    """

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The number of correct predictions in the batch."""
        return topk_correct(logits, targets, 1)
