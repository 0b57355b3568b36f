"""LiBai's ``engine.trainer`` path: the same objects as :mod:`ember.compat.detectron2.engine.train_loop`."""

from __future__ import annotations

from ember.compat.detectron2.engine.train_loop import HookBase, SimpleTrainer, TrainerBase

__all__ = ["HookBase", "SimpleTrainer", "TrainerBase"]
