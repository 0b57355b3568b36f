"""The hook-driven Trainer.

Example:
    >>> from ember.trainer import Trainer, Placeholders, hooks
    >>> trainer = Trainer(engine=engine)
    >>> trainer.fit(train_dl, epochs=10, test_dataloader=test_dl, display_progress=True,
    ...             hooks=[hooks.LossHook(), hooks.AccuracyHook(), hooks.LogMetricByEpochHook()])
"""

from __future__ import annotations

from ember.trainer import hooks
from ember.trainer._preempt import PREEMPTED_EXIT_CODE, Preempted
from ember.trainer._state import State
from ember.trainer.hooks.base import StopTraining
from ember.trainer.hooks.progress import ProgressBarHook
from ember.trainer.placeholders import Placeholders
from ember.trainer.schedule import DefaultSchedule, Schedule, Steps
from ember.trainer.storage import Cursor, History, StepStorage
from ember.trainer.trainer import Trainer

Trainer.progress_hook = ProgressBarHook  # what display_progress=True adds (the loop knows no concrete hook)

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "Cursor",
    "DefaultSchedule",
    "History",
    "Placeholders",
    "Preempted",
    "Schedule",
    "State",
    "StepStorage",
    "Steps",
    "StopTraining",
    "Trainer",
    "hooks",
]
