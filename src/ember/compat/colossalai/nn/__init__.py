"""Colossal-AI's ``colossalai.nn``: its learning-rate schedulers and its accuracy metric."""

from __future__ import annotations

from . import lr_scheduler, metric

__all__ = ["lr_scheduler", "metric"]
