"""Bad input gives one clear TrackingError naming the culprit, and the run stays usable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ember import track
from ember.errors import EmberError, TrackingError

BAD_CALLS: list[tuple[str, Callable[[track.Run, Path], Any], str]] = [
    ("non-numeric metric", lambda r, _: r.log("train", {"loss": "0.3"}, step=1), r"metric 'loss' = '0.3' \(str\)"),
    ("bool metric", lambda r, _: r.log("train", {"ok": True}, step=1), r"metric 'ok' = True \(bool\) is not a number"),
    ("None metric", lambda r, _: r.log("train", {"loss": None}, step=1), r"metric 'loss' = None"),
    ("list metric", lambda r, _: r.log("train", {"loss": [1.0]}, step=1), r"metric 'loss' = \[1.0\]"),
    ("tensor of many", lambda r, _: r.log("train", {"w": torch.ones(3)}, step=1), r"tensor of shape \(3,\)"),
    ("numpy bool", lambda r, _: r.log("train", {"b": np.bool_(True)}, step=1), "NumPy value"),
    ("metrics not a dict", lambda r, _: r.log("train", [("loss", 1.0)], step=1), "metrics must be a dict"),
    ("empty metrics", lambda r, _: r.log("train", {}, step=1), "metrics is empty"),
    ("non-str metric name", lambda r, _: r.log("train", {3: 1.0}, step=1), "metric name 3"),
    ("bad type", lambda r, _: r.log("../train", {"loss": 1.0}, step=1), r"metric type '\.\./train' is not allowed"),
    ("type not a str", lambda r, _: r.log(None, {"loss": 1.0}, step=1), "metric type None is not allowed"),
    ("negative step", lambda r, _: r.log("train", {"loss": 1.0}, step=-1), "step must be a non-negative int"),
    ("float step", lambda r, _: r.log("train", {"loss": 1.0}, step=1.5), "step must be a non-negative int"),
    ("bad epoch", lambda r, _: r.log("train", {"loss": 1.0}, step=1, epoch="one"), "epoch must be None"),
    (
        "unserialisable hparam",
        lambda r, _: r.hparams.update({"model": torch.nn.Linear(2, 2)}),
        r"hparam 'model' = Linear\(.*\) \(Linear\) cannot be stored as JSON",
    ),
    ("nested bad hparam", lambda r, _: r.hparams.update({"opt": {"betas": {1, 2}}}), r"hparam 'opt.betas'"),
    ("nan hparam", lambda r, _: r.hparams.update({"lr": float("nan")}), "hparam 'lr' is nan"),
    ("hparams not a dict", lambda r, _: r.hparams.update([("lr", 1)]), "hparams must be a dict"),
    ("bad labels", lambda r, _: setattr(r, "labels", "ddp"), "labels must be a list of str"),
    ("bad finish status", lambda r, _: r.finish("Done"), "use one of"),
    ("mark a path", lambda r, _: r.mark_output("model.pt"), "mark_output takes an Artifact or a Run, got str"),
    ("mark itself", lambda r, _: r.mark_input(r), "cannot be linked to itself"),
    (
        "missing file for add_file",
        lambda _, d: track.create_artifact("m").add_file(d / "missing.pt"),
        r"add_file: .*missing.pt does not exist",
    ),
    ("add_file of a folder", lambda _, d: track.create_artifact("m").add_file(d), "is not a file"),
    ("missing dir for add_dir", lambda _, d: track.create_artifact("m").add_dir(d / "nope"), "does not exist"),
    ("unsafe obj_path", lambda _, d: track.create_artifact("m").add_reference("s3://b/x", "../x"), "not a safe"),
    ("name with a slash", lambda _, d: track.create_run(name="a/b"), r"name 'a/b' cannot name a folder"),
    ("name with a backslash", lambda _, d: track.create_run(name="a\\b"), "cannot name a folder"),
    ("name with dots", lambda _, d: track.create_run(name=".."), "cannot name a folder"),
    ("name with NUL", lambda _, d: track.create_run(name="a\0b"), "cannot name a folder"),
    ("empty name", lambda _, d: track.create_run(name=""), "cannot name a folder"),
    ("artifact name with a slash", lambda _, d: track.create_artifact(name="x/y"), "cannot name a folder"),
    ("folder with dots", lambda _, d: track.create_run(folder="a/../b"), "folder 'a/../b' is not a safe"),
]


@pytest.mark.parametrize(("what", "call", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_a_clear_tracking_error_and_the_run_stays_usable(
    what: str, call: Callable[[track.Run, Path], Any], message: str, tmp_path: Path
) -> None:
    run = track.create_run(name="victim", hparams={"lr": 0.1})
    run.log("train", {"loss": 1.0}, step=0)
    with pytest.raises(TrackingError, match=message) as info:
        call(run, tmp_path)
    assert isinstance(info.value, EmberError) and isinstance(info.value, ValueError)
    run.log("train", {"loss": 0.5}, step=1)
    run.hparams.update({"after": True})
    run.finish()
    assert [p["metrics"]["loss"] for p in run.metrics("train")] == [1.0, 0.5]
    meta = json.loads((run.path / "run.json").read_text())  # type: ignore[operator]
    assert meta["hparams"] == {"lr": 0.1, "after": True} and meta["status"] == "Complete"


HUGE = "x" * 50_000_000  # 50 MB


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.log("train", {"loss": HUGE}, step=1),
        lambda r: r.log("train", {HUGE: "x"}, step=1),
        lambda r: r.log("train", {"n": 10**5000}, step=1),
        lambda r: r.log(HUGE, {"loss": 1.0}, step=1),
        lambda r: r.log("train", {"loss": 1.0}, step=HUGE),
        lambda r: r.hparams.update({"blob": HUGE.encode()}),
        lambda r: setattr(r, "labels", [HUGE, ""]),
    ],
    ids=["value", "name", "5000-digit int", "type", "step", "hparam", "label"],
)
def test_a_huge_bad_value_is_shown_cut_short_in_the_message(call: Callable[[track.Run], Any]) -> None:
    run = track.create_run(name="huge")
    with pytest.raises(TrackingError) as info:
        call(run)
    assert len(str(info.value)) < 1000
    run.finish()


def test_a_bad_value_among_good_ones_records_nothing_of_that_call() -> None:
    run = track.create_run(name="atomic")
    with pytest.raises(TrackingError, match="'bad'"):
        run.log("train", {"good": 1.0, "bad": "x"}, step=0)
    with pytest.raises(TrackingError):
        run.hparams.update({"good": 1, "bad": object()})
    run.finish()
    assert run.metrics("train") == [] and dict(run.hparams) == {}


def test_a_bad_create_run_argument_creates_nothing(store: Path) -> None:
    with pytest.raises(TrackingError, match="hparam 'f'"):
        track.create_run(name="x", hparams={"f": lambda: 1})
    with pytest.raises(TrackingError, match=r"label 1 in \[1\] must be a non-empty str"):
        track.create_run(name="x", labels=[1])
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())
