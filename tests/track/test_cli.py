"""``ember runs ls|show|compare|export|rm`` on real stores, through the argparse wiring."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track.cli import add_commands, main


def ember(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="ember")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return int(args.handler(args))


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[track.Run, track.Run]:
    (tmp_path / "model.pt").write_bytes(b"weights")
    a = track.create_run(name="baseline", hparams={"lr": 0.1, "batch_size": 64, "opt": {"name": "sgd"}})
    b = track.create_run(name="bigger-lr", hparams={"lr": 0.5, "batch_size": 64, "opt": {"name": "adam"}})
    for step in range(4):
        a.log("train", {"loss": 1.0 / (step + 1), "acc": 0.2 * step}, step=step, epoch=step // 2)
        b.log("train", {"loss": 2.0 / (step + 1), "acc": 0.1 * step}, step=step, epoch=step // 2)
    a.log("val", {"loss": 0.4, "acc": 0.9}, step=3, epoch=1)
    b.log("val", {"loss": math.nan, "acc": 0.7}, step=3, epoch=1)
    art = track.create_artifact("model")
    art.add_file(tmp_path / "model.pt")
    a.mark_output(art)
    a.finish()
    b.finish("Failed")
    return a, b


def test_ls_lists_every_run_with_status_start_duration_and_last_metrics(
    two_runs: tuple[track.Run, track.Run], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_runs
    running = track.create_run(name="ongoing")
    running.log("train", {"loss": 3.0}, step=0)
    running.flush()
    assert ember("runs", "ls") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "STARTED", "DURATION", "LAST", "METRICS"]
    rows = {line.split()[0]: line for line in out[1:]}
    assert set(rows) == {a.path.name, b.path.name, running.path.name}  # type: ignore[union-attr]
    assert " Complete " in rows[a.path.name] and "train: loss=0.25 acc=0.6 | val: loss=0.4 acc=0.9" in rows[a.path.name]  # type: ignore[union-attr]
    assert " Failed " in rows[b.path.name] and "val: loss=nan acc=0.7" in rows[b.path.name]  # type: ignore[union-attr]
    assert " Running " in rows[running.path.name]  # type: ignore[union-attr]
    running.finish()


def _died(run: track.Run, **changes: object) -> None:
    """Make ``run.json`` say what a process killed while the run was open leaves: Running."""
    meta_file = run.path / "run.json"  # type: ignore[operator]
    meta = json.loads(meta_file.read_text())
    meta.update(status="Running", end_time=None, **changes)
    meta_file.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "death",
    [
        pytest.param({"pid": 2**22 + 12345}, id="pid-gone"),  # above Linux's pid_max: no such process
        pytest.param(
            {"hostname": "another-host", "heartbeat": (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()},
            id="heartbeat-stale",
        ),
    ],
)
def test_ls_and_show_say_crashed_for_a_run_whose_process_died(
    death: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    dead = track.create_run(name="killed")
    dead.log("train", {"loss": 0.5}, step=7)
    dead.finish()
    _died(dead, **death)
    live = track.create_run(name="alive")
    assert ember("runs", "ls") == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[dead.path.name][1] == "Crashed" and "loss=0.5" in rows[dead.path.name]  # type: ignore[union-attr]
    assert rows[live.path.name][1] == "Running"  # type: ignore[union-attr]
    assert ember("runs", "show", "killed") == 0
    assert "status       Crashed" in capsys.readouterr().out
    live.finish()


def test_ls_of_an_empty_store_says_so(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ember("runs", "ls", "--store", str(store)) == 0
    assert capsys.readouterr().out == f"no runs in {store / 'runs'}\n"


def test_show_prints_hparams_platform_metric_summary_and_lineage(
    two_runs: tuple[track.Run, track.Run], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_runs
    assert ember("runs", "show", "base") == 0
    out = capsys.readouterr().out
    assert f"run          {a.path.name}" in out and f"id           {a.id}" in out  # type: ignore[union-attr]
    assert "status       Complete" in out
    assert 'hparams\n  lr          0.1\n  batch_size  64\n  opt.name    "sgd"' in out
    assert "platform\n  os " in out and "  torch    " in out
    assert "  train  loss    4       0-3    0.25  0.25  1" in out
    assert "  val    acc     1       3-3    0.9   0.9   0.9" in out
    assert "lineage\n  output  artifact model (artifacts/model_" in out and "1 file(s), 7 B)" in out


def test_compare_shows_differing_hparams_and_final_and_best_metrics(
    two_runs: tuple[track.Run, track.Run], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_runs
    assert ember("runs", "compare", a.path.name, "bigger") == 0  # type: ignore[union-attr]
    out = capsys.readouterr().out
    assert "hparams that differ (1 identical not shown)" in out
    assert [line.split() for line in out.splitlines() if line.startswith("  lr ")] == [["lr", "0.1", "0.5"]]
    assert '"sgd"' in out and '"adam"' in out and "batch_size" not in out
    lines = [line.split() for line in out.splitlines()]
    assert ["train/loss", "final", "0.25", "0.5"] in lines
    assert ["train/loss", "best", "(min)", "0.25", "0.5"] in lines
    assert ["train/acc", "best", "(max)", "0.6", "0.3"] in lines
    assert ["val/loss", "best", "(min)", "0.4", "-"] in lines  # NaN is never the best

    assert ember("runs", "compare", "base", "bigger", "--metric", "acc", "--mode", "min") == 0
    out = capsys.readouterr().out
    assert "loss" not in out.split("metrics")[1] and ["train/acc", "best", "(min)", "0", "0"] in [
        line.split() for line in out.splitlines()
    ]
    with pytest.raises(TrackingError, match="no run has a metric named 'f1'"):
        ember("runs", "compare", "base", "bigger", "--metric", "f1")


def test_export_csv_and_json_hold_every_point(
    two_runs: tuple[track.Run, track.Run], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, b = two_runs
    assert ember("runs", "export", "bigger", "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["type"], r["step"]) for r in rows] == [
        ("train", "0"),
        ("train", "1"),
        ("train", "2"),
        ("train", "3"),
        ("val", "3"),
    ]
    assert list(rows[0]) == ["type", "step", "epoch", "time", "acc", "loss"]
    assert float(rows[1]["loss"]) == 1.0 and rows[4]["loss"] == "nan" and rows[0]["epoch"] == "0"

    target = tmp_path / "b.json"
    assert ember("runs", "export", b.path.name, "--format", "json", "--output", str(target)) == 0  # type: ignore[union-attr]
    data = json.loads(target.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert data["run"]["id"] == b.id and data["run"]["status"] == "Failed"
    assert [p["step"] for p in data["metrics"]["train"]] == [0, 1, 2, 3]
    assert data["metrics"]["val"][0]["metrics"] == {"loss": "NaN", "acc": 0.7}
    assert data["platform"]["platform"]["python"]["version"]


def test_rm_removes_only_with_yes_and_never_a_live_run(
    two_runs: tuple[track.Run, track.Run], store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_runs
    with pytest.raises(TrackingError, match="pass --yes"):
        ember("runs", "rm", "base")  # stdin is not a terminal under pytest
    live = track.create_run(name="live")
    with pytest.raises(TrackingError, match=r"still running.*nothing was removed"):
        ember("runs", "rm", "live", "base", "--yes")
    assert a.path.exists() and live.path.exists()  # type: ignore[union-attr]
    assert ember("runs", "rm", "base", "--yes") == 0
    assert not a.path.exists() and b.path.exists()  # type: ignore[union-attr]
    live.finish()


def test_rename_label_note_change_run_json_and_never_a_live_run(
    two_runs: tuple[track.Run, track.Run], store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_runs
    assert ember("runs", "rename", "base", "the-baseline") == 0
    assert ember("runs", "label", "base", "bigger", "--add", "keep", "--add", "sweep") == 0
    assert ember("runs", "label", "bigger", "--remove", "sweep", "--add", "keep") == 0
    assert ember("runs", "note", "base", "beats everything\nso far") == 0
    meta_a = json.loads((a.path / "run.json").read_text())  # type: ignore[operator]
    meta_b = json.loads((b.path / "run.json").read_text())  # type: ignore[operator]
    assert (meta_a["name"], meta_a["labels"], meta_a["description"]) == (
        "the-baseline",
        ["keep", "sweep"],
        "beats everything\nso far",
    )
    assert meta_b["labels"] == ["keep"] and meta_b["status"] == "Failed" and a.path.exists()  # type: ignore[union-attr]
    assert track.load_run(a.path).name == "the-baseline"  # type: ignore[arg-type]
    with pytest.raises(TrackingError, match="--add LABEL"):
        ember("runs", "label", "base")
    with pytest.raises(TrackingError, match="cannot name a folder"):
        ember("runs", "rename", "base", "a/b")
    live = track.create_run(name="live")
    with pytest.raises(TrackingError, match="open in this process"):
        ember("runs", "note", "live", "x")
    live.finish()
    before = (a.path / "run.json").read_bytes()  # type: ignore[operator]
    with pytest.raises(TrackingError, match="label"):
        ember("runs", "label", "base", "--add", "")
    assert (a.path / "run.json").read_bytes() == before  # type: ignore[operator]


def test_bad_run_reference_is_reported_by_main_with_exit_code_2(
    two_runs: tuple[track.Run, track.Run], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "show", "nothing-like-this"]) == 2
    assert "ember: error: no run matches 'nothing-like-this'" in capsys.readouterr().err
    track.create_run(name="base-two").finish()
    assert main(["runs", "show", "base"]) == 2
    assert "'base' matches 2 runs" in capsys.readouterr().err


def test_python_dash_m_entry_point_lists_the_store(two_runs: tuple[track.Run, track.Run], store: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ember.track.cli", "runs", "ls", "--store", str(store)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "baseline_" in out and "bigger-lr_" in out
