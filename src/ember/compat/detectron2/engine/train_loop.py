"""detectron2's ``engine.train_loop`` path: ``HookBase``, ``TrainerBase``, ``SimpleTrainer``.

``HookBase`` and ``TrainerBase`` (and detectron2's loop) are in
:mod:`ember.compat.detectron2.engine.base`; ``SimpleTrainer``, on ember's Trainer, in
:mod:`ember.compat.detectron2.engine.simple`.
"""

from __future__ import annotations

from ember.compat.detectron2.engine.base import HookBase, TrainerBase
from ember.compat.detectron2.engine.simple import SimpleTrainer

__all__ = ["HookBase", "SimpleTrainer", "TrainerBase"]
