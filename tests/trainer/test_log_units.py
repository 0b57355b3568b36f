"""The timing and memory hooks' log lines use ember's one formatter (ember._format): durations as
``ember runs`` shows them, memory in binary units labelled as such (MiB, never MB for 2**20)."""

from __future__ import annotations

import itertools
import re

import pytest

from ember.trainer import Trainer, hooks
from ember.trainer.hooks import timing
from tests.trainer.helpers import RecordingLogger, loader, make_engine


def test_memory_is_logged_in_binary_units_labelled_as_such() -> None:
    log = RecordingLogger()
    memory = hooks.LogMemoryByEpochHook(log)
    Trainer(make_engine()).fit(loader(16, 8), epochs=1, hooks=[memory])
    [line] = log.lines("memory | rss")
    assert re.search(r"rss (\d+\.\d (MiB|GiB) )?\(peak \d+\.\d (MiB|GiB)\)", line), line
    assert " MB" not in line
    assert memory.last["rss_peak"] > 1  # the numbers stay in MiB (tracking stores them so)


def test_epoch_times_are_formatted_as_everywhere_else(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(0.0, 100_000.0)  # every reading 100,000 s after the last
    monkeypatch.setattr(timing, "perf_counter", lambda: next(clock))
    log = RecordingLogger()
    Trainer(make_engine()).fit(loader(16, 8), epochs=1, hooks=[hooks.LogTimingByEpochHook(log)])
    [line] = log.lines("timing | train ")
    assert line.endswith("train 1d03h46m"), line  # 100,000 s: a day and more, as ember runs shows it
