"""Colossal-AI's MoE losses: a loss plus ``aux_weight`` × the auxiliary loss in ``MOE_CONTEXT``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ember.errors import EngineError

from ...moe_context import MOE_CONTEXT

__all__ = ["MoeCrossEntropyLoss", "MoeLoss"]


class MoeLoss(nn.Module):
    """``loss_fn(*args, **kwargs)(output, target) + aux_weight * MOE_CONTEXT.get_loss()``.

    The model adds each MoE layer's ``l_aux`` with ``MOE_CONTEXT.add_loss`` (after
    ``MOE_CONTEXT.reset_loss()`` at the start of its forward), as in Colossal-AI.

    Args:
        aux_weight: the weight of the auxiliary loss.
        loss_fn: the loss class, e.g. ``torch.nn.CrossEntropyLoss``.
        args: its positional arguments.
        kwargs: its keyword arguments (``label_smoothing=0.1``...).

    Example:
        >>> criterion = MoeLoss(aux_weight=0.01, loss_fn=nn.CrossEntropyLoss, label_smoothing=0.1)
    """

    def __init__(self, aux_weight: float, loss_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        if not callable(loss_fn):
            raise EngineError(f"MoeLoss(loss_fn={loss_fn!r}) needs the loss's class, e.g. torch.nn.CrossEntropyLoss")
        self.loss_fn = loss_fn(*args, **kwargs)
        self.aux_weight = aux_weight

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.loss_fn(*args, **kwargs) + self.aux_weight * MOE_CONTEXT.get_loss()


class MoeCrossEntropyLoss(MoeLoss):
    """``torch.nn.CrossEntropyLoss(*args, **kwargs)`` plus ``aux_weight`` × the auxiliary loss.

    Example:
        >>> criterion = MoeCrossEntropyLoss(aux_weight=0.01, label_smoothing=0.1)
    """

    def __init__(self, aux_weight: float = 0.01, *args: Any, **kwargs: Any) -> None:
        super().__init__(aux_weight, nn.CrossEntropyLoss, *args, **kwargs)
