"""Reading the store: torn lines, resumable cursors, crash detection, finding runs by name."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track import store as st
from ember.track._values import last_point, read_points


def _finished_run(name: str = "r", points: int = 3) -> track.Run:
    run = track.create_run(name=name)
    for step in range(points):
        run.log("train", {"loss": float(step)}, step=step)
    run.finish()
    return run


def test_a_torn_last_line_is_ignored_and_the_cursor_stops_before_it() -> None:
    run = _finished_run(points=3)
    path = run.path / "metrics" / "train.jsonl"  # type: ignore[operator]
    complete = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b'{"step":3,"epoch":null,"time":17')
    points, cursor = read_points(path)
    assert [p["step"] for p in points] == [0, 1, 2] and cursor == complete
    assert last_point(path)["step"] == 2  # type: ignore[index]
    with open(path, "ab") as f:  # the writer finishes the line: a reader continues from its cursor
        f.write(b'00000000.5,"metrics":{"loss":3.0}}\n')
    more, cursor2 = read_points(path, cursor)
    assert [p["step"] for p in more] == [3] and cursor2 == path.stat().st_size


def test_a_damaged_complete_line_is_an_error_naming_the_file() -> None:
    run = _finished_run(points=2)
    path = run.path / "metrics" / "train.jsonl"  # type: ignore[operator]
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + "garbage\n" + lines[1] + "\n")
    with pytest.raises(TrackingError, match=r"train.jsonl: record 2 after byte 0 is damaged"):
        read_points(path)


def _rewrite(run: track.Run, **changes: object) -> dict:
    meta = json.loads((run.path / "run.json").read_text())  # type: ignore[operator]
    meta.update(changes)
    (run.path / "run.json").write_text(json.dumps(meta))  # type: ignore[operator]
    return meta


def test_a_running_run_whose_process_is_gone_or_silent_shows_as_crashed(store: Path) -> None:
    live = track.create_run(name="live")
    dead_pid = _finished_run("deadpid")
    stale = _finished_run("stale")
    _rewrite(dead_pid, status="Running", pid=2**22 + 12345)  # above pid_max: no such process
    old = (datetime.now(timezone.utc) - timedelta(seconds=st.STALE_AFTER_S + 5)).isoformat()
    _rewrite(stale, status="Running", hostname="another-host", heartbeat=old)
    statuses = {i.meta["name"]: i.status for i in st.list_runs(store)}
    assert statuses == {"live": "Running", "deadpid": "Crashed", "stale": "Crashed"}
    live.finish()
    assert {i.meta["name"]: i.status for i in st.list_runs(store)}["live"] == "Complete"


def test_the_heartbeat_of_an_open_run_is_refreshed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ember.track.run.HEARTBEAT_INTERVAL_S", 0.1)
    run = track.create_run(name="beat")
    first = json.loads((run.path / "run.json").read_text())["heartbeat"]  # type: ignore[operator]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if json.loads((run.path / "run.json").read_text())["heartbeat"] != first:  # type: ignore[operator]
            break
    else:
        pytest.fail("heartbeat never changed")
    run.finish()


def test_resume_of_a_crashed_run_is_allowed_and_of_a_live_one_refused(store: Path) -> None:
    crashed = _finished_run("crashed")
    _rewrite(crashed, status="Running", pid=2**22 + 12345)
    resumed = track.load_run(crashed.path, resume=True)  # type: ignore[arg-type]
    resumed.finish()
    other = _finished_run("other")
    import os

    _rewrite(other, status="Running", pid=os.getppid())  # a live process that is not this one
    with pytest.raises(TrackingError, match=r"still Running in pid \d+ on .*finish it there first"):
        track.load_run(other.path, resume=True)  # type: ignore[arg-type]


def test_a_run_is_found_by_path_folder_name_or_unique_prefix(store: Path) -> None:
    a = _finished_run("alpha", 1)
    b = _finished_run("alpine", 1)
    assert st.resolve(str(a.path), store) == a.path
    assert st.resolve(a.path.name, store) == a.path  # type: ignore[union-attr]
    assert st.resolve("alph", store) == a.path
    with pytest.raises(TrackingError, match=r"'al' matches 2 runs.*\n  alp.*\n  alp"):
        st.resolve("al", store)
    with pytest.raises(TrackingError, match="no run matches 'zeta'"):
        st.resolve("zeta", store)
    with pytest.raises(TrackingError, match="is not a run folder"):
        st.resolve("/nonexistent/folder", store)
    assert track.load_run("alpi").id == b.id


def test_a_folder_without_run_json_yet_is_not_listed(store: Path) -> None:
    _finished_run("done", 1)
    (store / "runs" / "half_260101_000000_abcdef").mkdir()
    (store / "runs" / ".done_x.tmp").mkdir()
    assert [i.meta["name"] for i in st.list_runs(store)] == ["done"]


def test_lookups_by_whole_name_list_nothing_and_prefixes_list_the_names_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ember.track import store as store_module
    from ember.track.cli import main

    runs = []
    for i in range(12):
        run = track.create_run(name=f"lookup{i:02d}")
        run.log("train", {"loss": float(i)}, step=0)
        run.finish()
        runs.append(run.path.name)  # type: ignore[union-attr]
    listed: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: Any = ".") -> Any:
        if Path(path).name == "runs":
            listed.append(str(path))
        return real_scandir(path)

    real_iterdir = Path.iterdir

    def counting_iterdir(self: Path) -> Any:
        if self.name == "runs":
            listed.append(str(self))
        return real_iterdir(self)

    monkeypatch.setattr(store_module.os, "scandir", counting_scandir)
    monkeypatch.setattr(Path, "iterdir", counting_iterdir)
    assert main(["runs", "compare", *runs[:10]]) == 0
    assert main(["runs", "show", runs[11]]) == 0
    assert listed == []  # whole names: one look-up each, whatever the size of the store
    assert main(["runs", "compare", "lookup00", "lookup01", "lookup02"]) == 0
    assert len(listed) == 1  # prefixes: the names are listed once for the whole command
    capsys.readouterr()
