"""LiBai's ``engine.trainer`` path: the same objects as :mod:`ember.compat.detectron2.engine.train_loop`."""

from __future__ import annotations

from ember.compat.detectron2.engine.base import HookBase, TrainerBase
from ember.compat.detectron2.engine.simple import SimpleTrainer

__all__ = ["HookBase", "SimpleTrainer", "TrainerBase"]
