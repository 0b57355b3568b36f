"""A run records which way its metrics are better (issue 19): ``Run.define_metric``, the Trainer's hooks.

Before, no run recorded a direction: "best" was read from the metric's name alone, so a
``score_gap`` that early stopping minimised was shown at its maximum ("score" reads as a score).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track.best import MODES_KEY, best_value, majority_mode, metric_mode, recorded_modes
from ember.track.cli import add_commands
from ember.track.run import NoOpRun


def _run_json(run: track.Run) -> dict[str, Any]:
    assert run.path is not None
    return json.loads((run.path / "run.json").read_text())


def _compare(*runs: str, capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["runs", "compare", *runs])
    assert args.handler(args) == 0
    return [line.split() for line in capsys.readouterr().out.splitlines()]


def test_a_recorded_mode_beats_the_name_rule() -> None:
    assert metric_mode("val/score_gap") == "max"  # the name rule: "score" reads as a score
    assert metric_mode("val/score_gap", recorded="min") == "min"
    assert metric_mode("val/loss", recorded="max") == "max"
    assert best_value("val/score_gap", 0.1, 0.9) == 0.9
    assert best_value("val/score_gap", 0.1, 0.9, "min") == 0.1
    with pytest.raises(TrackingError, match="mode must be 'min' or 'max', got 'lowest'"):
        metric_mode("val/x", recorded="lowest")


def test_define_metric_writes_run_json_and_ember_runs_compare_follows_it(capsys: pytest.CaptureFixture[str]) -> None:
    run = track.create_run(name="gap")
    run.define_metric("validation/score_gap", mode="min")  # an alias of the type: stored as val
    for step, gap in enumerate((0.3, 0.1, 0.2)):
        run.log("val", {"score_gap": gap}, step=step)
    run.finish()
    assert _run_json(run)[MODES_KEY] == {"val/score_gap": "min"}
    other = track.create_run(name="other")  # records nothing
    for step, gap in enumerate((0.05, 0.5)):
        other.log("val", {"score_gap": gap}, step=step)
    other.finish()
    assert run.path is not None and other.path is not None
    lines = _compare(run.path.name, other.path.name, capsys=capsys)
    assert ["val/score_gap", "best", "(min)", "0.1", "0.05"] in lines  # the one run that records a mode decides
    assert ["val/score_gap", "best", "(max)", "0.5"] in _compare(other.path.name, capsys=capsys)  # the name rule


@pytest.mark.parametrize(
    ("name", "mode", "message"),
    [
        ("val/acc", "maximize", r"define_metric\('val/acc', mode=...\): mode must be 'min' or 'max', got 'maximize'"),
        ("val/acc", None, "mode must be 'min' or 'max', got None"),
        ("acc", "max", "name it TYPE/NAME as the console shows it, e.g. 'val/acc'"),
        ("val/", "max", "has no name after its type 'val'"),
        ("bad type/acc", "max", "metric type 'bad type' is not allowed"),
        (3, "max", "name it TYPE/NAME"),
        ("val/" + "x" * 400, "max", "at most 300 characters"),
    ],
)
def test_a_bad_mode_or_name_is_a_clear_error_and_records_nothing(name: Any, mode: Any, message: str) -> None:
    run = track.create_run(name="bad")
    with pytest.raises(TrackingError, match=message):
        run.define_metric(name, mode)
    assert MODES_KEY not in _run_json(run)
    run.define_metric("val/acc", "max")  # the run stays usable
    with pytest.raises(TrackingError, match=message):
        NoOpRun({"id": "", "name": "x", "hparams": {}}).define_metric(name, mode)  # other ranks check too
    run.finish()
    with pytest.raises(TrackingError, match="is finished; reopen it"):
        run.define_metric("val/acc", "min")


def test_the_modes_survive_a_resume_and_a_second_call_replaces_one(store: Path) -> None:
    run = track.create_run(name="resumed")
    run.define_metric("val/score_gap", "min")
    run.define_metric("train/tokens", "max")
    run.finish("Preempted")
    again = track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    assert recorded_modes(_run_json(again)) == {"val/score_gap": "min", "train/tokens": "max"}
    again.define_metric("train/tokens", "min")
    again.finish()
    assert _run_json(again)[MODES_KEY] == {"val/score_gap": "min", "train/tokens": "min"}
    assert recorded_modes(_run_json(track.load_run(run.path))) == _run_json(again)[MODES_KEY]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({MODES_KEY: {"val/a": "min", "val/b": "max"}}, {"val/a": "min", "val/b": "max"}),
        ({MODES_KEY: {"val/a": "up", "val/b": 1, "val/c": None, "val/d": "max"}}, {"val/d": "max"}),
        ({MODES_KEY: ["val/a", "min"]}, {}),
        ({}, {}),
        (None, {}),
        ("not a dict", {}),
    ],
)
def test_reading_the_recorded_modes_leaves_out_what_is_not_min_or_max(meta: Any, expected: dict[str, str]) -> None:
    assert recorded_modes(meta) == expected


@pytest.mark.parametrize(
    ("recorded", "mode"),
    [
        (["min", "min", "max"], "min"),  # the mode most runs record
        (["min", None, None, None], "min"),  # runs that record nothing do not vote
        (["min", "max"], "max"),  # a tie: the name rule (score_gap reads as a score)
        ([None, None], "max"),  # none recorded: the name rule
        (["max", "junk", "junk"], "max"),
    ],
)
def test_runs_shown_together_share_the_mode_most_of_them_record(recorded: list[Any], mode: str) -> None:
    assert majority_mode("val/score_gap", recorded) == mode


def _fit_with(tmp_path: Path, *watchers: Any) -> dict[str, Any]:
    from ember.trainer import Trainer, hooks
    from tests.trainer.helpers import loader, make_engine

    score_gap = hooks.MetricHook(lambda out, y: (out[:, 0] - out[:, 1]).abs().mean(), "score_gap", mode="min")
    tracking = hooks.TrackingHook(name="hooked", home=str(tmp_path / "hooked"))
    trainer = Trainer(make_engine())
    trainer.fit(loader(32, 8), epochs=2, test_dataloader=loader(16, 8),
                hooks=[hooks.LossHook(), score_gap, *watchers, tracking])  # fmt: skip
    return _run_json(tracking.run)  # type: ignore[arg-type]


def test_tracking_hook_records_the_mode_early_stopping_watches_a_metric_with(tmp_path: Path) -> None:
    from ember.trainer import hooks

    stop = hooks.EarlyStoppingHook("test/score_gap", patience=5, mode="min")
    meta = _fit_with(tmp_path, stop)
    assert meta[MODES_KEY] == {"val/score_gap": "min"}  # test/<x> is the run's val/<x>
    assert metric_mode("val/score_gap", recorded_modes(meta).get("val/score_gap")) == "min"


def test_tracking_hook_records_a_best_checkpoints_mode_and_nothing_for_a_default_mode(tmp_path: Path) -> None:
    from ember.trainer import hooks

    ckpt = hooks.CheckpointHook(tmp_path / "ckpt", save_best="train/loss", mode="min", keep_last=1)
    default = hooks.EarlyStoppingHook("test/score_gap", patience=5)  # mode left to its default: says nothing
    meta = _fit_with(tmp_path, ckpt, default)
    assert meta[MODES_KEY] == {"train_epoch/loss": "min", "train/loss": "min"}
    assert hooks.CheckpointHook(tmp_path / "c2", save_best="test/acc").metric_modes() == {}
    assert hooks.CheckpointHook(tmp_path / "c3", mode="min").metric_modes() == {}  # no save_best


def test_two_hooks_disagreeing_on_a_mode_record_the_first_and_warn(tmp_path: Path) -> None:
    from ember.trainer import Trainer, hooks
    from tests.trainer.helpers import RecordingLogger, loader, make_engine

    trainer = Trainer(make_engine())
    trainer.logger = RecordingLogger()
    tracking = hooks.TrackingHook(home=str(tmp_path / "store"))
    stop = hooks.EarlyStoppingHook("test/loss", patience=5, mode="min")
    ckpt = hooks.CheckpointHook(tmp_path / "ckpt", save_best="test/loss", mode="max")
    trainer.fit(loader(16, 8), epochs=1, test_dataloader=loader(8, 8), hooks=[hooks.LossHook(), stop, ckpt, tracking])
    assert _run_json(tracking.run)[MODES_KEY] == {"val/loss": "min"}  # type: ignore[arg-type]
    warnings = [m for level, m in trainer.logger.records if level == "warning" and "TrackingHook" in m]
    assert len(warnings) == 1 and "'test/loss' with mode='max'" in warnings[0], trainer.logger.records


def test_a_trainer_runs_modes_survive_a_resume(tmp_path: Path) -> None:
    from ember.trainer import hooks

    _fit_with(tmp_path, hooks.EarlyStoppingHook("test/score_gap", patience=5, mode="min"))
    (folder,) = (tmp_path / "hooked" / "runs").iterdir()
    resumed = track.load_run(folder, resume=True)
    resumed.log("val", {"score_gap": 0.0}, step=100)
    resumed.finish()
    assert recorded_modes(_run_json(resumed)) == {"val/score_gap": "min"}


def test_an_uploaded_run_keeps_its_modes_and_the_runs_table_follows_them(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from ember.track.client import Client, Credentials, upload_run
    from tests.server.conftest import make_server

    run = track.create_run(name="up")
    run.define_metric("val/score_gap", "min")
    for step, gap in enumerate((0.3, 0.1, 0.2)):
        run.log("val", {"score_gap": gap}, step=step)
    run.finish()
    server = make_server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    with server.client:
        client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
        upload_run(run.path, "t", True, "new", client)  # type: ignore[arg-type]
        assert server.req("GET", f"/runs/{run.id}").json()["meta"][MODES_KEY] == {"val/score_gap": "min"}
        page = server.req("GET", "/search/runs").json()
    assert page["metric_modes"]["val/score_gap"] == "min"
    assert page["runs"][0]["metrics"]["val/score_gap"]["best"] == 0.1
