"""TrackingHook: a Trainer run lands in the tracking store, and a resumed run continues it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember import track
from ember.track.store import list_runs
from ember.trainer import Trainer, hooks
from tests.trainer.helpers import loader, make_engine


class FailAt(hooks.BaseHook):
    """Raises after the given optimizer step."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def after_train_iter(self, output, label, loss) -> None:
        if self.trainer.cur_step == self.step:
            raise RuntimeError(f"boom at {self.step}")


def _steps(run: track.Run, type_: str) -> list[int]:
    return [p["step"] for p in run.metrics(type_)]


def test_fit_records_hparams_metrics_and_status(tmp_path: Path) -> None:
    trainer = Trainer(make_engine(accumulation=2))
    tracking = hooks.TrackingHook(name="tiny", hparams={"note": "x"}, home=str(tmp_path))
    trainer.fit(loader(64, 8), epochs=2, test_dataloader=loader(16, 8),
                hooks=[hooks.LossHook(), hooks.AccuracyHook(), tracking])  # fmt: skip
    run = track.load_run(tracking.run.path, home=tmp_path)
    assert run.status == "Complete"
    assert run.hparams["gradient_accumulation"] == 2 and run.hparams["note"] == "x"
    assert run.hparams["optimizer"] == "SGD" and run.hparams["optimizer.lr"] == 0.1
    assert _steps(run, "train") == list(range(1, 9))  # 8 updates: 16 batches / accumulation 2
    assert [p["epoch"] for p in run.metrics("val")] == [0, 1]
    assert set(run.metrics("val")[0]["metrics"]) == {"loss", "accuracy"}
    assert _steps(run, "train_epoch") == [4, 8]


def test_a_failing_fit_marks_the_run_failed(tmp_path: Path) -> None:
    tracking = hooks.TrackingHook(home=str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(make_engine()).fit(loader(64, 8), epochs=1, hooks=[FailAt(3), tracking])
    assert track.load_run(tracking.run.path, home=tmp_path).status == "Failed"


def test_resume_continues_the_same_run_without_duplicate_steps(tmp_path: Path) -> None:
    engine = make_engine()
    first = Trainer(engine)
    tracking = hooks.TrackingHook(name="resumed", home=str(tmp_path))
    saved: dict = {}

    class Snapshot(hooks.BaseHook):
        def after_train_epoch(self) -> None:  # what a checkpoint at the end of epoch 0 would hold
            if not saved:
                saved.update(engine=engine.state_dict(), trainer=self.trainer.state_dict(),
                             hooks=self.trainer.hook_states())  # fmt: skip

    with pytest.raises(RuntimeError):  # the job dies in epoch 1, after logging steps 9..11
        first.fit(loader(64, 8), epochs=3, hooks=[hooks.LossHook(), Snapshot(priority="LOWEST"), tracking, FailAt(11)])
    path = tracking.run.path

    engine2 = make_engine()
    engine2.load_state_dict(saved["engine"])
    second = Trainer(engine2)
    second.load_state_dict(saved["trainer"])
    second.load_hook_states({"TrackingHook": saved["hooks"]["TrackingHook"]}, strict=False)
    resumed = hooks.TrackingHook(home=str(tmp_path))
    second.fit(loader(64, 8), epochs=3, hooks=[hooks.LossHook(), resumed])

    assert resumed.run.path == path
    run = track.load_run(path, home=tmp_path)
    steps = _steps(run, "train")
    assert steps == list(range(1, 25)), steps  # no step twice, none missing
    assert run.status == "Complete"
    assert len(list_runs(tmp_path)) == 1
