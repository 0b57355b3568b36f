"""detectron2's ``engine`` (and LiBai's): the trainers, ``HookBase`` and the hooks.

Example:
    >>> from ember.compat.detectron2.engine import HookBase, SimpleTrainer, hooks
"""

from __future__ import annotations

from ember.compat.detectron2.engine import hooks
from ember.compat.detectron2.engine.base import HookBase, TrainerBase
from ember.compat.detectron2.engine.hooks import (
    CallbackHook,
    EvalHook,
    IterationTimer,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
)
from ember.compat.detectron2.engine.simple import SimpleTrainer

__all__ = [
    "CallbackHook",
    "EvalHook",
    "HookBase",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "SimpleTrainer",
    "TrainerBase",
    "hooks",
]
