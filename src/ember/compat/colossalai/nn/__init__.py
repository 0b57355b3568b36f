"""Colossal-AI's ``colossalai.nn``: its learning-rate schedulers, its accuracy metric and its optimizers."""

from __future__ import annotations

from . import lr_scheduler, metric, optimizer
from .optimizer import FusedAdam, FusedLAMB, FusedSGD, Lamb

__all__ = ["FusedAdam", "FusedLAMB", "FusedSGD", "Lamb", "lr_scheduler", "metric", "optimizer"]
