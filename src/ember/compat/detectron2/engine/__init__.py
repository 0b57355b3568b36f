"""detectron2's ``engine`` (and LiBai's): the trainers, ``HookBase`` and the hooks.

Example:
    >>> from ember.compat.detectron2.engine import HookBase, SimpleTrainer, hooks
"""

from __future__ import annotations

from ember.compat._not_provided import module_getattr
from ember.compat.detectron2.engine import hooks
from ember.compat.detectron2.engine.base import HookBase, TrainerBase
from ember.compat.detectron2.engine.defaults import (
    default_argument_parser,
    default_setup,
    default_writers,
    launch,
)
from ember.compat.detectron2.engine.hooks import (
    BestCheckpointer,
    CallbackHook,
    EvalHook,
    IterationTimer,
    LRScheduler,
    PeriodicCheckpointer,
    PeriodicWriter,
)
from ember.compat.detectron2.engine.simple import SimpleTrainer

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "EvalHook",
    "HookBase",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
    "SimpleTrainer",
    "TrainerBase",
    "default_argument_parser",
    "default_setup",
    "default_writers",
    "hooks",
    "launch",
]

__getattr__ = module_getattr(__name__, "detectron2.engine", {
    "DefaultTrainer": "it builds everything from a yacs config; build a SimpleTrainer (ember's Trainer underneath) "
                      "with your model, loader and optimizer, and register the hooks you need",
    "AMPTrainer": "set amp='fp16' or 'bf16' in ember's config: SimpleTrainer's step runs under it",
    "DefaultPredictor": "load the weights (ember.checkpoint.model_state) into your model and call it in eval mode",
    "create_ddp_model": "give the plain model to SimpleTrainer: ember makes it data-parallel from its config",
    "default_config_parser": "ember has no LazyConfig system: use default_argument_parser and your own config",
})  # fmt: skip
