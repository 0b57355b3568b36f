"""On loopback with a real ``ember server`` process: login, train, upload; kill and resume; auto-upload."""

from __future__ import annotations

import json
import stat
import threading
import time
from pathlib import Path

import httpx
import pytest

from ember import track
from ember.server.cli import main as server_main
from ember.track import client as client_mod
from ember.track.client import UploadError, credentials_path, upload_run
from ember.track.retry import Retry
from tests.server._runs import sha256, train_tiny
from tests.server.conftest import ServerProcess


def _get(proc: ServerProcess, key: str, path: str, **params: str) -> dict:
    r = httpx.get(f"{proc.url}/api/v1{path}", params=params, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _stored_values(proc: ServerProcess, key: str, run_id: str) -> int:
    return sum(m["count"] for m in _get(proc, key, f"/runs/{run_id}")["metrics"])


def _local_values(run_dir: Path) -> int:
    return sum(
        len(json.loads(line)["metrics"])
        for f in (run_dir / "metrics").glob("*.jsonl")
        for line in f.read_text().splitlines()
    )


def test_login_train_upload_end_to_end(server_process: tuple[ServerProcess, str], home: Path, tmp_path: Path) -> None:
    proc, key = server_process
    assert server_main(["login", "--host", proc.url, "--api-key", key]) == 0
    assert stat.S_IMODE(credentials_path().stat().st_mode) == 0o600
    assert credentials_path().parent == home / ".ember"
    run, weights = train_tiny(tmp_path / "store", steps=30)
    run.finish()
    run.upload(folder="examples", make_folder=True)
    got = _get(proc, key, f"/runs/{run.id}")
    assert got["folder"] == "/alice/examples" and got["hparams"] == {"lr": 0.1, "hidden": 8}
    assert got["platform"]["platform"]["hostname"]
    assert _stored_values(proc, key, run.id) == _local_values(run.path)
    steps = [p["step"] for p in _get(proc, key, f"/runs/{run.id}/metrics", type="train")["points"]]
    assert steps == list(range(30))
    art = next(e["target"] for e in got["lineage"] if e["target"]["kind"] == "artifact")
    r = httpx.get(f"{proc.url}/api/v1/artifacts/{art['id']}/files/model.pt", headers={"Authorization": f"Bearer {key}"})
    import hashlib

    assert hashlib.sha256(r.content).hexdigest() == sha256(weights)
    assert server_main(["upload", str(tmp_path / "store")]) == 0  # the whole store again: nothing new
    assert _stored_values(proc, key, run.id) == _local_values(run.path)
    assert track.logout() and not credentials_path().exists()


def test_killing_the_server_mid_upload_then_retrying_completes_without_duplicates(
    server_process: tuple[ServerProcess, str], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, key = server_process
    monkeypatch.setenv("EMBER_HOST", proc.url)
    monkeypatch.setenv("EMBER_API_KEY", key)
    monkeypatch.setattr(client_mod, "BATCH_LINES", 50)
    patient = client_mod.DEFAULT_RETRY
    monkeypatch.setattr(client_mod, "DEFAULT_RETRY", Retry(deadline_s=0.5, base_s=0.05))  # give up while it is down
    run = track.create_run(name="big", home=tmp_path / "store")
    for step in range(6000):
        run.log("train", {"loss": 1.0 / (step + 1), "acc": step / 6000}, step=step)
    run.finish()
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            upload_run(run.path)
        except UploadError as e:
            errors.append(e)

    thread = threading.Thread(target=upload)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # kill once some metric points (not just metadata) are in
        run_info = httpx.get(f"{proc.url}/api/v1/runs/{run.id}", headers={"Authorization": f"Bearer {key}"})
        if run_info.status_code == 200 and sum(m["count"] for m in run_info.json()["metrics"]) > 0:
            break
        time.sleep(0.01)
    proc.kill()
    thread.join(30)
    assert errors, "the upload finished before the server was killed; make the run bigger"
    proc.start()
    partial = _stored_values(proc, key, run.id)
    assert 0 < partial < 12000  # part of the run, committed batch by batch
    monkeypatch.setattr(client_mod, "DEFAULT_RETRY", patient)  # the retry, as a user's, may wait for a busy server
    upload_run(run.path)
    assert _stored_values(proc, key, run.id) == 12000
    steps = [p["step"] for p in _get(proc, key, f"/runs/{run.id}/metrics", type="train")["points"]]
    assert steps == list(range(6000))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the client's retries; the store is not what is tested
def test_auto_upload_catches_up_after_the_server_was_down(
    server_process: tuple[ServerProcess, str], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, key = server_process
    monkeypatch.setenv("EMBER_HOST", proc.url)
    monkeypatch.setenv("EMBER_API_KEY", key)
    monkeypatch.setattr(client_mod.AutoUploader.__init__, "__defaults__", (0.2, Retry(deadline_s=0.3, base_s=0.05)))
    run = track.create_run(name="auto", home=tmp_path / "store", auto_upload=True)

    def log(steps: range) -> None:
        for step in steps:
            started = time.perf_counter()
            run.log("train", {"loss": float(step)}, step=step)
            assert time.perf_counter() - started < 0.05  # never blocked by the uploader

    log(range(0, 100))
    run.flush()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = httpx.get(f"{proc.url}/api/v1/runs/{run.id}", headers={"Authorization": f"Bearer {key}"})
        if r.status_code == 200 and sum(m["count"] for m in r.json()["metrics"]) == 100:
            break
        time.sleep(0.1)
    else:
        pytest.fail("auto-upload did not send the first 100 points")
    proc.kill()
    log(range(100, 200))
    time.sleep(0.6)  # the uploader tries and fails meanwhile; training goes on
    assert run._uploader.last_error is not None
    proc.start()
    log(range(200, 300))
    run.finish()
    assert _stored_values(proc, key, run.id) == 300
    assert _get(proc, key, f"/runs/{run.id}")["status"] == "Complete"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_server_processes_on_postgresql_store_concurrent_uploads_once(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ember.server.services import admin
    from ember.server.storage.settings import Settings
    from ember.track.client import Client, Credentials

    settings = Settings.make(data_dir=tmp_path / "data", db_url=db_url)
    key = admin.init(settings, "alice")
    monkeypatch.setattr(client_mod, "BATCH_LINES", 300)  # many requests, spread over both workers
    runs = []
    for i in range(3):
        run = track.create_run(name=f"w{i}", home=tmp_path / "store")
        for step in range(3000):
            run.log("train", {"loss": 1.0 / (step + 1), "acc": step / 3000}, step=step)
        run.finish()
        runs.append(run)
    proc = ServerProcess(settings.data_dir, db_url, workers=2).start()
    try:
        errors: list[BaseException] = []

        def upload(run: track.Run) -> None:
            try:
                with Client(Credentials(proc.url, key)) as client:
                    upload_run(run.path, client=client, artifacts=False)
            except UploadError as e:
                errors.append(e)

        with Client(Credentials(proc.url, key)) as client:  # created first: only their streams race
            for run in runs:
                client.call("PUT", f"/runs/{run.id}", json={"run": json.loads((run.path / "run.json").read_text())})
        # runs[0] twice at once: the two uploads of one stream take turns on its cursor
        threads = [threading.Thread(target=upload, args=(r,)) for r in [*runs, runs[0]]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for run in runs:
            assert _stored_values(proc, key, run.id) == 6000
            got = _get(proc, key, f"/runs/{run.id}/series", type="train", buckets="10")["metrics"]
            assert got["loss"]["count"] == 3000 and max(got["loss"]["value"]) == 1.0
            assert min(got["acc"]["value"]) == 0.0
    finally:
        proc.stop()
