"""The progress bar's samples/s is ember's one measurement of throughput (issue 20): the
ThroughputHook's figure when one is registered, else a ThroughputMeter of the bar's own that
puts nothing into the storage the writers read."""

from __future__ import annotations

import re

import pytest

from ember.trainer import Trainer, hooks
from tests.trainer.helpers import loader, make_engine


def _shown(err: str) -> list[str]:
    return re.findall(r"samples/s=([0-9.e+]+)\]", err.replace("\r", "\n"))


def test_the_bar_shows_the_throughput_hooks_figure(capsys: pytest.CaptureFixture[str]) -> None:
    speed = hooks.ThroughputHook(every_n=2, logger=False)
    trainer = Trainer(make_engine())
    trainer.fit(loader(64, 8), epochs=1, hooks=[speed, hooks.ProgressBarHook(refresh_s=0)])
    shown = _shown(capsys.readouterr().err)
    published = {f"{value:.3g}" for _, value in trainer.storage.values("throughput/samples_per_s")}
    assert len(published) >= 2 and shown and set(shown) <= published, (shown, published)
    assert shown[-1] == f"{speed.samples_per_s:.3g}"


def test_without_a_throughput_hook_the_bar_measures_and_publishes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    bar = hooks.ProgressBarHook(refresh_s=0)
    trainer = Trainer(make_engine())
    trainer.fit(loader(64, 8), epochs=2, test_dataloader=loader(16, 8), hooks=[bar])
    shown = _shown(capsys.readouterr().err)
    assert bar.refreshes >= 16 and shown and all(float(v) > 0 for v in shown)
    assert not {"throughput/samples_per_s", "time/step_s", "time/eta_s"} & set(trainer.storage.names())


def test_display_progress_adds_no_second_series_of_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    speed = hooks.ThroughputHook(every_n=4, logger=False)
    trainer = Trainer(make_engine())
    trainer.fit(loader(64, 8), epochs=1, hooks=[speed], display_progress=True)
    steps = [step for step, _ in trainer.storage.values("throughput/samples_per_s")]
    assert steps == [4, 8]  # the ThroughputHook's windows only: the bar added none
    assert _shown(capsys.readouterr().err)
