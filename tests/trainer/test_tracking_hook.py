"""TrackingHook: a Trainer run lands in the tracking store, and a resumed run continues it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ember import track
from ember.track.store import list_artifacts, list_runs
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
    # fractional epochs: the val after the first epoch is at 1.0, a train step halfway through at 0.5
    assert [p["epoch"] for p in run.metrics("val")] == [1.0, 2.0]
    assert [p["epoch"] for p in run.metrics("train")][:4] == [0.25, 0.5, 0.75, 1.0]
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


def test_train_points_carry_samples_per_second_of_every_micro_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(0.5 * i for i in range(1000))  # each perf_counter() call: 0.5 s later
    monkeypatch.setattr("ember.trainer.hooks.timing.perf_counter", lambda: next(clock))
    tracking = hooks.TrackingHook(log_every_n_steps=2, system_interval_s=None, home=str(tmp_path))
    Trainer(make_engine(accumulation=2)).fit(loader(64, 8), epochs=1, hooks=[tracking])
    points = track.load_run(tracking.run.path, home=tmp_path).metrics("train")
    # a point every 2 updates = 4 batches of 8 samples, 0.5 s apart
    assert [(p["step"], p["metrics"]["samples_per_s"]) for p in points] == [(2, 64.0), (4, 64.0)]


def test_system_points_carry_cpu_use_and_load_average(tmp_path: Path) -> None:
    tracking = hooks.TrackingHook(system_interval_s=0.0, home=str(tmp_path))
    Trainer(make_engine()).fit(loader(32, 8), epochs=1, hooks=[tracking])
    points = track.load_run(tracking.run.path, home=tmp_path).metrics("system")
    assert [p["step"] for p in points] == [1, 2, 3, 4]
    for point in points:
        assert point["metrics"]["cpu_percent"] >= 0.0 and point["metrics"]["rss_peak"] > 0
        if hasattr(os, "getloadavg"):
            assert point["metrics"]["load_1m"] >= 0.0


def _checkpointed_fit(
    ckpt_dir: Path, home: Path, epochs: int = 3, max_steps: int | None = None, extra: tuple = ()
) -> tuple[hooks.TrackingHook, hooks.CheckpointHook]:
    """One job of a restartable script: a fresh Trainer, a checkpoint every 4 updates, resume='auto'.

    ``save_best`` keeps the epoch with the *highest* test loss, the first one, so the best and
    final checkpoints differ and retention (``keep_last=1``) deletes everything else.
    """
    ckpt = hooks.CheckpointHook(ckpt_dir, every_n_steps=4, keep_last=1, save_best="test/loss", mode="max")
    tracking = hooks.TrackingHook(name="restartable", system_interval_s=0.0, home=str(home))
    Trainer(make_engine()).fit(loader(64, 8), epochs=epochs, max_steps=max_steps, test_dataloader=loader(16, 8),
                               hooks=[hooks.LossHook(), ckpt, tracking, *extra], resume="auto")  # fmt: skip
    return tracking, ckpt


def test_a_job_resumed_from_a_checkpoint_file_continues_the_same_run(tmp_path: Path) -> None:
    # max_steps=10 ends the job 2 updates into epoch 1 and closes that epoch (docs/trainer.md):
    # the resumed job trains epoch 2, steps 11..18.
    first, _ = _checkpointed_fit(tmp_path / "ckpt", tmp_path, max_steps=10)
    run_id, path = first.run.id, first.run.path
    assert track.load_run(path, home=tmp_path).status == "Complete"

    second, _ = _checkpointed_fit(tmp_path / "ckpt", tmp_path)
    assert (second.run.id, second.run.path) == (run_id, path)
    run = track.load_run(path, home=tmp_path)
    assert _steps(run, "train") == list(range(1, 19))
    assert _steps(run, "system") == list(range(1, 19))
    assert _steps(run, "train_epoch") == [8, 10, 18]
    assert [p["epoch"] for p in run.metrics("val")] == [1.0, 1.25, 3.0]  # epoch 1 closed after 2 of 8
    assert run.status == "Complete"
    assert [i.meta["id"] for i in list_runs(tmp_path)] == [run_id]


def test_a_crashed_then_resumed_run_has_one_checkpoints_artifact_of_final_and_best(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom at 14"):
        _checkpointed_fit(tmp_path / "ckpt", tmp_path, extra=(FailAt(14),))  # last checkpoint: step 12
    tracking, ckpt = _checkpointed_fit(tmp_path / "ckpt", tmp_path)
    run = track.load_run(tracking.run.path, home=tmp_path)
    assert run.status == "Complete" and _steps(run, "train") == list(range(1, 25))

    outputs = [e["target"] for e in run.lineage() if e["source"]["id"] == run.id]
    assert [(o["kind"], o["name"]) for o in outputs] == [("artifact", "restartable-checkpoints")]
    assert len(list_artifacts(tmp_path)) == 1
    artifact = track.load_artifact(outputs[0]["path"].split("/")[-1], home=tmp_path)
    final, best = ckpt.last_path, ckpt.best_path
    assert final is not None and best is not None and final != best
    assert sorted(f["path"] for f in artifact.files) == sorted([final.name, best.name])
    for record in artifact.files:  # the source still exists, the copy is that file
        source = Path(record["source"])
        assert source.parent == (tmp_path / "ckpt").absolute() and source.is_file()
        copy = artifact.path / "files" / record["path"]
        assert copy.read_bytes() == source.read_bytes()
    assert sorted(p.name for p in (artifact.path / "files").iterdir()) == sorted([final.name, best.name])


class SignalAt(hooks.BaseHook):
    """Sends SIGTERM to this process after the given optimizer step (a scheduler preempting the job)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def after_train_iter(self, output, label, loss) -> None:
        if self.trainer.cur_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class FailsAtTheEnd(hooks.BaseHook):
    def after_train(self) -> None:
        raise RuntimeError("could not upload the report")


def test_a_preempted_fit_is_recorded_preempted_and_its_resume_ends_complete(tmp_path: Path) -> None:
    from ember.trainer import Preempted

    ckpt = tmp_path / "ckpt"
    tracking = hooks.TrackingHook(name="preempted", home=str(tmp_path))
    with pytest.raises(Preempted):
        Trainer(make_engine()).fit(loader(64, 8), epochs=2,
                                   hooks=[SignalAt(3), hooks.CheckpointHook(ckpt), tracking])  # fmt: skip
    run = track.load_run(tracking.run.path, home=tmp_path)
    assert run.status == "Preempted" and "SIGTERM" in run.reason
    resumed = hooks.TrackingHook(name="preempted", home=str(tmp_path))
    Trainer(make_engine()).fit(loader(64, 8), epochs=2, hooks=[hooks.CheckpointHook(ckpt), resumed], resume="auto")
    assert resumed.run.path == run.path
    again = track.load_run(run.path, home=tmp_path)
    assert again.status == "Complete" and again.reason is None
    assert len(again._meta["resumes"]) == 1


def test_a_run_whose_after_train_hook_raised_is_failed_with_the_reason(tmp_path: Path) -> None:
    tracking = hooks.TrackingHook(home=str(tmp_path))
    with pytest.raises(RuntimeError, match="could not upload"):
        Trainer(make_engine()).fit(loader(16, 8), epochs=1, hooks=[FailsAtTheEnd(), tracking])
    run = track.load_run(tracking.run.path, home=tmp_path)
    assert run.status == "Failed" and "could not upload the report" in run.reason


def test_a_failing_fit_records_the_error_as_the_reason(tmp_path: Path) -> None:
    tracking = hooks.TrackingHook(home=str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(make_engine()).fit(loader(64, 8), epochs=1, hooks=[FailAt(2), tracking])
    assert track.load_run(tracking.run.path, home=tmp_path).reason.startswith("RuntimeError: boom at 2")
