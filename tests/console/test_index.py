"""`ember ui` on a big store (issue 18, items 10 and 2), without a browser.

Before: every page re-listed every file of every run (0.85 s a page at 10,000 runs) and the first
page uploaded the whole store over HTTP first (105 s); a run.json cut short made every page a 500.
Now pages read only the database, a background index reads the store newest first and then only
the run folders that changed, and a folder ember could not have written is listed ``Damaged``.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from sqlalchemy import select

from ember import track
from ember.server.app import create_app
from ember.server.local import index as index_module
from ember.server.local.ui import build_app
from ember.server.services import admin
from ember.server.services.upload import Uploads
from ember.server.storage.models import User
from ember.server.storage.settings import Settings
from ember.track.client import Client, Credentials, upload_artifact, upload_run
from ember.track.lineage import run_folder
from tests.console._data import make_store, stored_rows, write_runs

BASE = "http://127.0.0.1:8766"


class StoreReads:
    """Records the file system calls (open, stat, scandir) that touch a folder, from every thread."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self._lock = str(root), threading.Lock()
        self.calls: list[tuple[str, str]] = []
        for module, name in ((builtins, "open"), (os, "open"), (os, "stat"), (os, "lstat"), (os, "scandir")):
            monkeypatch.setattr(module, name, self._counting(name, getattr(module, name)))

    def _counting(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            path = args[0] if args else kwargs.get("path", kwargs.get("file", "."))
            if isinstance(path, str | os.PathLike) and str(os.fspath(path)).startswith(self.root):
                with self._lock:
                    self.calls.append((name, str(os.fspath(path))))
            return real(*args, **kwargs)

        return call

    def opened(self) -> set[str]:
        """The run folders (names) a file was opened in."""
        runs = Path(self.root) / "runs"
        return {
            Path(p).relative_to(runs).parts[0] for kind, p in self.calls if kind == "open" and p.startswith(str(runs))
        }

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()


def enter(client: TestClient, entry: str) -> None:
    """Open the link `ember ui` printed (its token sets the cookie)."""
    assert client.get(entry.replace(BASE, ""), follow_redirects=True).status_code == 200


def names(page: str) -> list[str]:
    return re.findall(r'class="run-link" href="[^"]+">([^<]*)</a>', page)


def test_a_cold_start_answers_at_once_and_indexes_the_newest_runs_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_runs(tmp_path / "store", 120)
    app, entry = build_app(tmp_path / "store", 8766, tmp_path / "ui")
    with TestClient(app, base_url=BASE) as client:
        enter(client, entry)
        reads = StoreReads(tmp_path / "store", monkeypatch)
        first = client.get("/ui/runs")
        assert first.status_code == 200 and reads.calls == []  # the first page waits for nothing of the store
        index = app.state.console_index
        monkeypatch.setattr(index_module, "PASS_S", 0.0)  # one run a pass: the index stops half-way
        monkeypatch.setattr(index_module, "BATCH_S", 0.0)
        index.step()
        page = client.get("/ui/runs").text
        assert names(page) == ["r00119"] and 'data-indexed="1"' in page and "1 of 120 runs" in page
        for _ in range(49):
            index.step()
        page = client.get("/ui/runs").text
        newest = [p.name.split("_")[0] for p in reversed(paths[-50:])]
        assert names(page) == newest and "50 of 120 runs" in page  # the first page is already the right one
        monkeypatch.undo()
        while index.step():
            pass
        page = client.get("/ui/runs").text
        assert names(page) == newest and "(120)" in page and 'id="indexing"' not in page


def test_pages_read_nothing_of_the_store_and_a_pass_rereads_only_the_runs_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store"
    paths = write_runs(store, 200)
    app, entry = build_app(store, 8766, tmp_path / "ui")
    index = app.state.console_index
    while index.step():
        pass
    resumed = track.load_run(paths[7], resume=True)
    resumed.log("train", {"loss": 0.01}, step=3)
    resumed.finish()
    new = write_runs(store, 1, first=500)[0]
    with TestClient(app, base_url=BASE) as client:
        enter(client, entry)
        reads = StoreReads(store, monkeypatch)
        for path in ("/ui/runs", "/ui/runs?sort=-hp:i", "/ui/folders?path=/local/default"):
            assert client.get(path).status_code == 200
        assert reads.calls == []  # before: every page listed and stat-ed every file of every run
        index.step()
        assert reads.opened() == {paths[7].name, new.name}  # the other 199 runs: a stat at most
        reads.clear()
        index.step()
        assert reads.opened() == set()
        found = client.get("/ui/runs?q=r00007").text
        run_id = re.search(r'href="/ui/runs/([0-9a-f]{32})"', found)
        assert run_id and names(found) == ["r00007"]
        series = client.get(f"/ui/runs/{run_id.group(1)}/series", params={"type": "train"}).json()
        assert series["status"] == "Complete" and len(series["metrics"]["loss"]["step"]) == 4
        assert "r00500" in names(client.get("/ui/runs").text)
        shutil.rmtree(paths[9])  # `ember runs rm`
        index.step()
        assert names(client.get("/ui/runs?q=r0000").text) == [f"r0000{i}" for i in (8, 7, 6, 5, 4, 3, 2, 1, 0)]


def test_indexing_writes_the_rows_an_upload_writes(tmp_path: Path) -> None:
    """One upload through each receiver of the protocol (ember.track.receiver) stores the same rows: ember ui's
    index (new runs batched: services/upload.NewRuns), the HTTP client (`ember upload`, through the API's
    routes) and the server's own receiver in process (services/upload.Uploads), artifacts and blobs too."""
    store = tmp_path / "store"
    make_store(store)  # trained runs: NaN and infinities, two metric types, lineage to an artifact
    live = track.create_run(name="live", home=store, hparams={"nest": {"a": [1, 2.5]}}, labels=["x"], description="d")
    for step in range(300):  # three 128-step blocks
        live.log("train", {"loss": 1 / (step + 1), "acc": step / 300}, step=step, epoch=step // 100)
        if step % 50 == 0:
            live.log("val", {"acc": step / 300}, step=step)
    live.log_image("samples", np.arange(12, dtype=np.uint8).reshape(3, 4), step=0)  # images.jsonl and its PNG
    live.log_image("samples/b", np.ones((2, 2, 3), np.float32), step=7)
    live.flush()  # still Running
    stopped = track.create_run(name="stopped", home=store, folder="a/b")
    stopped.log("train", {"loss": 2.0}, step=0)
    stopped.finish("Preempted", "SIGTERM")
    app, _ = build_app(store, 8766, tmp_path / "ui")
    with TestClient(app, base_url=BASE) as ui:
        app.state.console_index.http = ui  # its artifacts go over "HTTP", through the test client
        while app.state.console_index.step():
            pass
        indexed = stored_rows(app)
    settings = Settings.make(data_dir=tmp_path / "server", db_url=f"sqlite:///{tmp_path / 'server.db'}")
    key = admin.init(settings, "local")
    server = create_app(settings)
    with TestClient(server) as http:
        client = Client(Credentials("http://testserver", key), http=http)
        for art in sorted((store / "artifacts").iterdir()):
            upload_artifact(art, run_folder(art) or "default", True, "new", client)  # beside its run
        for run in sorted((store / "runs").iterdir()):
            upload_run(run, None, True, "new", client, artifacts=False)
        uploaded = stored_rows(server)
    settings = Settings.make(data_dir=tmp_path / "direct", db_url=f"sqlite:///{tmp_path / 'direct.db'}")
    admin.init(settings, "local")
    direct = create_app(settings)
    with TestClient(direct), direct.state.sessions() as session, session.begin():
        user = session.scalar(select(User).where(User.name == "local"))
        assert user is not None
        uploads = Uploads(session, user, direct.state.settings, direct.state.blobs, in_process=True)
        for art in sorted((store / "artifacts").iterdir()):
            upload_artifact(art, run_folder(art) or "default", True, "new", uploads)  # beside its run
        for run in sorted((store / "runs").iterdir()):
            upload_run(run, None, True, "new", uploads, artifacts=False)
    in_process = stored_rows(direct)
    blobs = [eval(row[-1]) for row in in_process["artifacts"]]
    live.finish()
    assert len(indexed["runs"]) == 4 and len(indexed["points"]) == 793 and indexed["lineage"]
    assert len(indexed["images"]) == 2
    assert indexed == uploaded
    assert in_process == uploaded
    assert blobs and all(direct.state.blobs.has(sha) for sha in blobs)


def _damage(store: Path) -> dict[str, str]:
    """Run folders ember could not have written, by name, with a word of the reason each is listed for."""
    good = write_runs(store, 3)
    made = {}
    for i, (name, why) in enumerate([("cut", "not valid JSON"), ("link", "symbolic link"), ("flat", "not a folder")]):
        path = write_runs(store, 1, first=10 + i)[0]
        made[path.name] = why
        if name == "cut":
            (path / "run.json").write_text('{"id": "0123')
        elif name == "link":
            (path / "stdout.log").unlink()
            (path / "stdout.log").symlink_to(good[0] / "platform.json")
        else:
            shutil.rmtree(path / "metrics")
            (path / "metrics").write_text("not a folder")
    copy = store / "runs" / f"{good[0].name.split('_')[0]}_260101_000200_copy00"
    shutil.copytree(good[0], copy)
    made[copy.name] = "a copy"
    return made


def test_damaged_run_folders_are_listed_with_their_reason_and_no_page_fails(tmp_path: Path) -> None:
    store = tmp_path / "store"
    damaged = _damage(store)
    stopped = track.create_run(name="stopped", home=store)
    stopped.finish("Preempted", "SIGTERM at step 5")
    app, entry = build_app(store, 8766, tmp_path / "ui")
    index = app.state.console_index
    with TestClient(app, base_url=BASE) as client:
        enter(client, entry)
        while index.step():
            pass
        page = client.get("/ui/runs")
        assert page.status_code == 200 and len(names(page.text)) == 8  # before: a 500 for every page
        assert "4 run folders are damaged" in page.text and "Preempted" in page.text
        listed = client.get("/ui/runs", params={"status": "Damaged"}).text
        rows = re.findall(r'href="/ui/runs/([0-9a-f]{32})">.*?class="status damaged">Damaged</span>'
                          r'<span class="reason" title="([^"]*)"', listed, re.S)  # fmt: skip
        assert len(rows) == 4
        for folder, why in damaged.items():
            assert sum(folder in reason or why in reason for _, reason in rows) >= 1, (folder, why, rows)
        for run_id, _ in rows:
            run_page = client.get(f"/ui/runs/{run_id}")
            assert run_page.status_code == 200 and "This run folder is damaged" in run_page.text
        assert client.get("/ui/folders", params={"path": "/local/default"}).status_code == 200
        cut = next(store / "runs" / n for n, why in damaged.items() if why == "not valid JSON")
        good = next(p for p in sorted((store / "runs").iterdir()) if p.name.startswith("r00001_"))
        meta = json.loads((good / "run.json").read_text())
        (cut / "run.json").write_text(json.dumps({**meta, "id": "f" * 32, "name": "repaired"}))  # mended by hand
        (good / "run.json").write_text("{")  # and a run indexed before is damaged now
        index.step()
        assert "repaired" in names(client.get("/ui/runs", params={"status": "Complete"}).text)
        broken = client.get("/ui/runs", params={"status": "Damaged", "q": "r00001"}).text
        assert meta["id"] in re.findall(r'href="/ui/runs/([0-9a-f]{32})"', broken)  # under its id: points kept
        series = client.get(f"/ui/runs/{meta['id']}/series", params={"type": "train"}).json()
        assert series["status"] == "Damaged" and len(series["metrics"]["loss"]["step"]) == 3
