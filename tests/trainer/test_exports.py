"""The public names for writing a hook or a metric writer are exported where docs/architecture.md says."""

from __future__ import annotations

from ember import trainer
from ember.trainer import hooks
from ember.trainer.hooks.timing import ThroughputMeter
from ember.trainer.hooks.writer import StepWriter
from ember.trainer.storage import Cursor


def test_writers_and_the_throughput_meter_are_exported_with_the_hooks() -> None:
    assert hooks.StepWriter is StepWriter and "StepWriter" in hooks.__all__
    assert hooks.ThroughputMeter is ThroughputMeter and "ThroughputMeter" in hooks.__all__


def test_the_storage_cursor_is_exported_with_the_storage() -> None:
    assert trainer.Cursor is Cursor and "Cursor" in trainer.__all__
    assert {"StepStorage", "History"} <= set(trainer.__all__)
    assert all(hasattr(hooks, name) for name in hooks.__all__)
    assert all(hasattr(trainer, name) for name in trainer.__all__)
