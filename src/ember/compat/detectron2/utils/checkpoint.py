"""LiBai's ``utils.checkpoint`` path: the same objects as :mod:`ember.compat.detectron2.checkpoint`."""

from __future__ import annotations

from ember.compat.detectron2.checkpoint import Checkpointer, DetectionCheckpointer

__all__ = ["Checkpointer", "DetectionCheckpointer"]
