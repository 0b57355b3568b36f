"""Hooks: everything optional in the Trainer's loop.

Subclass :class:`BaseHook` and override the lifecycle methods you need; see
``ember/trainer/hooks/base.py`` for when each one runs, and ``docs/hooks.md``. A new place
to send per-step scalars subclasses :class:`StepWriter`; a writer that needs throughput
without a :class:`ThroughputHook` drives a :class:`ThroughputMeter`.

Example:
    >>> from ember.trainer import Trainer, hooks
    >>> trainer.fit(train_dl, epochs=5, test_dataloader=test_dl,
    ...             hooks=[hooks.LossHook(), hooks.AccuracyHook(), hooks.LogMetricByEpochHook()])
"""

from __future__ import annotations

from ember.trainer.hooks.base import EVENTS, BaseHook, Priority, StopTraining
from ember.trainer.hooks.checkpoint import CheckpointHook
from ember.trainer.hooks.ema import EMAHook
from ember.trainer.hooks.logger import LogMetricByEpochHook, LogMetricByStepHook
from ember.trainer.hooks.lr_scheduler import LRSchedulerHook
from ember.trainer.hooks.memory import LogMemoryByEpochHook
from ember.trainer.hooks.metrics import AccuracyHook, LossHook, MetricHook
from ember.trainer.hooks.progress import ProgressBarHook
from ember.trainer.hooks.stopping import EarlyStoppingHook, TerminateOnNaNHook
from ember.trainer.hooks.tensorboard import TensorboardHook
from ember.trainer.hooks.timing import LogTimingByEpochHook, ThroughputHook, ThroughputMeter
from ember.trainer.hooks.tracking import TrackingHook
from ember.trainer.hooks.writer import StepWriter

__all__ = [
    "EVENTS",
    "AccuracyHook",
    "BaseHook",
    "CheckpointHook",
    "EMAHook",
    "EarlyStoppingHook",
    "LRSchedulerHook",
    "LogMemoryByEpochHook",
    "LogMetricByEpochHook",
    "LogMetricByStepHook",
    "LogTimingByEpochHook",
    "LossHook",
    "MetricHook",
    "Priority",
    "ProgressBarHook",
    "StepWriter",
    "StopTraining",
    "TensorboardHook",
    "TerminateOnNaNHook",
    "ThroughputHook",
    "ThroughputMeter",
    "TrackingHook",
]
