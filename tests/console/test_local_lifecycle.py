"""`ember ui` started again, stopped by SIGTERM, and over a metrics file with a damaged line (issue 19, `ember ui`).

Before: a second start on the same ``--data`` failed ("the server already has users"); SIGTERM
left the temporary database folder behind (uvicorn re-raises the signal with the default
handler, which kills the process before its ``finally``); one damaged metrics line listed the
run Damaged and hid every point from the start of its batch on.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from ember.server.local.index import StoreIndex
from ember.server.local.ui import build_app
from tests.console._data import stored_rows, write_runs
from tests.console.test_index import BASE, enter, names
from tests.server.conftest import free_port


def _index(store: Path, data: Path) -> tuple[TestClient, str]:
    app, entry = build_app(store, 8766, data)
    while app.state.console_index.step():
        pass
    app.state.console_index.step()  # the pass after the cold start: what is gone is dropped
    client = TestClient(app, base_url=BASE)
    enter(client, entry)
    return client, entry


def _run_id(client: TestClient, name: str) -> str:
    found = re.search(r'href="/ui/runs/([0-9a-f]{32})"', client.get("/ui/runs", params={"q": name}).text)
    assert found, name
    return found.group(1)


def _damage_a_line(path: Path, line: int) -> None:
    """Replace line ``line`` of the run's train metrics by something that is not a metric point."""
    lines = (path / "metrics" / "train.jsonl").read_text().splitlines(keepends=True)
    lines[line] = '{"step": 4, "metrics": "garbage"}\n'
    (path / "metrics" / "train.jsonl").write_text("".join(lines))


def test_ember_ui_starts_again_on_the_same_data_folder(tmp_path: Path) -> None:
    store, data = tmp_path / "store", tmp_path / "data"
    paths = write_runs(store, 3, points=5)
    client, _ = _index(store, data)
    with client:
        assert sorted(names(client.get("/ui/runs").text)) == ["r00000", "r00001", "r00002"]
    shutil.rmtree(paths[0])  # while ember ui is stopped: removed, and a run added
    write_runs(store, 1, first=7, points=5)
    client, _ = _index(store, data)  # before: ServerError "the server already has users"
    with client:
        assert sorted(names(client.get("/ui/runs").text)) == ["r00001", "r00002", "r00007"]
        series = client.get(f"/ui/runs/{_run_id(client, 'r00001')}/series", params={"type": "train"}).json()
        assert series["metrics"]["loss"]["step"] == [0, 1, 2, 3, 4]  # read again from its cursors, nothing twice


def test_a_restart_reads_only_the_run_folders_that_changed_and_stores_what_a_cold_start_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33, item 4: a restart on ``--data`` lists an unchanged folder from the manifest of what it
    read last time (its files' sizes, inodes and times), without opening it; a folder changed while
    ember ui was stopped is read again, and the database then holds what a cold start on the same
    store writes."""
    store, data = tmp_path / "store", tmp_path / "data"
    paths = write_runs(store, 5, points=5)
    (paths[4] / "run.json").write_text("[]")  # Damaged from the start: listed with its reason
    client, _ = _index(store, data)
    with client:
        assert "status damaged" in client.get("/ui/runs", params={"q": "r00004"}).text
    with open(paths[1] / "metrics" / "train.jsonl", "a") as f:  # while ember ui is stopped: points appended,
        f.writelines(json.dumps({"step": s, "time": 1.7e9 + s, "metrics": {"loss": 0.5}}) + "\n" for s in (5, 6))
    meta = json.loads((paths[2] / "run.json").read_text())
    (paths[2] / "run.json").write_text(json.dumps({**meta, "name": "renamed", "labels": ["edited"]}))  # edited,
    (paths[3] / "run.json").write_text("{not json")  # damaged, and one added
    write_runs(store, 1, first=7, points=5)
    checked: list[str] = []
    check = StoreIndex._check
    monkeypatch.setattr(StoreIndex, "_check", lambda self, name, seen: checked.append(name) or check(self, name, seen))
    client, _ = _index(store, data)
    changed = [paths[1], paths[2], paths[3], *store.glob("runs/r00007_*")]
    assert sorted(set(checked)) == sorted(p.name for p in changed)
    with client:
        assert "status damaged" in client.get("/ui/runs", params={"q": "r00004"}).text  # still, with its reason
        assert "it holds [] (list), not an object" in client.get(f"/ui/runs/{_run_id(client, 'r00004')}").text
        series = client.get(f"/ui/runs/{_run_id(client, 'r00001')}/series", params={"type": "train"}).json()
        assert series["metrics"]["loss"]["step"] == [0, 1, 2, 3, 4, 5, 6]
        restarted = stored_rows(client.app)
    cold, _ = _index(store, tmp_path / "cold")
    assert restarted == stored_rows(cold.app)
    assert "renamed" in restarted["runs"].__repr__() and len(restarted["runs"]) == 6


def test_a_damaged_metrics_line_is_skipped_with_a_note_and_the_rest_of_the_run_is_shown(tmp_path: Path) -> None:
    store, data = tmp_path / "store", tmp_path / "data"
    new, indexed = write_runs(store, 2, points=40)
    _damage_a_line(new, 4)  # before it is first read: the cold start's batch path
    client, _ = _index(store, data)
    with open(indexed / "metrics" / "train.jsonl", "a") as f:  # after it was indexed: the update path
        f.write("not json\n")
        f.writelines(json.dumps({"step": s, "time": 1.7e9 + s, "metrics": {"loss": 0.5}}) + "\n" for s in (40, 41))
    client.app.state.console_index.step()
    with client:
        page = client.get("/ui/runs").text
        assert "status damaged" not in page and "damaged" not in page.split("<table")[0]  # before: both Damaged
        for name, steps, why in (("r00000", 39, "is not a metric point"), ("r00001", 42, "is not JSON")):
            run_id = _run_id(client, name)
            series = client.get(f"/ui/runs/{run_id}/series", params={"type": "train"}).json()
            assert series["status"] == "Complete" and len(series["metrics"]["loss"]["step"]) == steps, name
            run_page = client.get(f"/ui/runs/{run_id}").text
            assert 'id="run-skipped"' in run_page and "metrics/train.jsonl: the line at byte" in run_page
            assert why in run_page, name
    client, _ = _index(store, data)  # the note outlives a restart (the run is uploaded again)
    with client:
        assert 'id="run-skipped"' in client.get(f"/ui/runs/{_run_id(client, 'r00000')}").text


def test_sigterm_stops_ember_ui_and_removes_its_temporary_folder(tmp_path: Path) -> None:
    write_runs(tmp_path / "store", 1)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    port = free_port()
    argv = [sys.executable, "-m", "ember.server.cli", "ui", "--store", str(tmp_path / "store"), "--port", str(port)]
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None
            try:
                httpx.get(f"http://127.0.0.1:{port}/ui/login", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert [p.name for p in scratch.iterdir() if p.name.startswith("ember-ui-")]  # its database is there
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode != 0 and [p.name for p in scratch.iterdir() if p.name.startswith("ember-ui-")] == []
