"""Colossal-AI's ``colossalai.nn.loss``: the MoE losses (``MoeLoss``, ``MoeCrossEntropyLoss``)."""

from __future__ import annotations

from .loss_moe import MoeCrossEntropyLoss, MoeLoss

__all__ = ["MoeCrossEntropyLoss", "MoeLoss"]
