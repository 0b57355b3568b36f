"""The upload protocol over the ASGI app: complete, idempotent, resumable; conflicts; bad requests."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ember.track import client as client_mod
from ember.track.client import Client, Credentials, UploadError, upload_run
from ember.track.retry import Retry
from tests.server._runs import sha256, train_tiny
from tests.server.conftest import Server, make_server

FAST = Retry(deadline_s=0.3, base_s=0.01, max_backoff_s=0.05)  # a cut connection fails the upload quickly


def _client(server: Server, user: str = "alice", http: Any = None) -> Client:
    return Client(Credentials("http://testserver", server.keys[user]), http=http or server.client, retry=FAST)


def _count(server: Server, table: str) -> int:
    with server.client.app.state.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def _local_values(run_dir: Path) -> int:
    total = 0
    for file in (run_dir / "metrics").glob("*.jsonl"):
        total += sum(len(json.loads(line)["metrics"]) for line in file.read_text().splitlines())
    return total


def _as_stored(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    return ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else value


def test_upload_is_complete_and_uploading_twice_adds_nothing(server: Server, tmp_path: Path) -> None:
    run, weights = train_tiny(tmp_path / "store", steps=25)
    run.finish()
    first = upload_run(run.path, folder="examples", make_folder=True, client=_client(server))
    assert first["action"] == "created" and first["folder"] == "/alice/examples"
    got = server.req("GET", f"/runs/{run.id}").json()
    assert got["hparams"] == {"lr": 0.1, "hidden": 8} and got["status"] == "Complete"
    assert got["platform"]["platform"]["python"]
    for type_ in ("train", "val"):
        served = server.req("GET", f"/runs/{run.id}/metrics", params={"type": type_}).json()["points"]
        local = run.metrics(type_)
        assert [p["step"] for p in served] == [p["step"] for p in local]
        for got_point, local_point in zip(served, local, strict=True):
            assert got_point["metrics"] == {k: _as_stored(v) for k, v in local_point["metrics"].items()}
    assert served[0]["metrics"]["acc"] == local[0]["metrics"]["acc"]
    train = {
        p["step"]: p["metrics"]
        for p in server.req("GET", f"/runs/{run.id}/metrics", params={"type": "train"}).json()["points"]
    }
    assert train[3]["weird"] == "NaN" and train[4]["weird"] == "Infinity" and train[5]["weird"] == 5.0
    assert "step 9 loss" in server.req("GET", f"/runs/{run.id}/log").json()["text"]
    art = [e["target"] for e in got["lineage"] if e["target"]["kind"] == "artifact"]
    assert len(art) == 1
    files = server.req("GET", f"/artifacts/{art[0]['id']}").json()["files"]
    assert files == [{"path": "model.pt", "size": weights.stat().st_size, "sha256": sha256(weights)}]
    content = server.req("GET", f"/artifacts/{art[0]['id']}/files/model.pt").content
    assert content == weights.read_bytes()
    counts = {
        t: _count(server, t) for t in ("metric_points", "log_pieces", "lineage", "blobs", "artifact_files", "runs")
    }
    assert counts["metric_points"] == _local_values(run.path)
    again = upload_run(run.path, folder="examples", client=_client(server))
    assert again["action"] == "updated"
    assert {t: _count(server, t) for t in counts} == counts


class CutOff:
    """An http client that fails every request after the first ``n`` (a connection cut)."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.left = inner, n

    def request(self, *args: Any, **kwargs: Any) -> Any:
        import httpx

        if self.left <= 0:
            raise httpx.ConnectError("cut")
        self.left -= 1
        return self.inner.request(*args, **kwargs)


@pytest.mark.parametrize("cut_after", [1, 2, 4, 7])
def test_an_upload_cut_off_anywhere_completes_on_retry_without_duplicates(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut_after: int
) -> None:
    monkeypatch.setattr(client_mod, "BATCH_LINES", 7)
    run, _ = train_tiny(tmp_path / "store", steps=40)
    run.finish()
    with pytest.raises(UploadError, match="cannot reach"):
        upload_run(run.path, client=_client(server, http=CutOff(server.client, cut_after)))
    upload_run(run.path, client=_client(server))
    assert _count(server, "metric_points") == _local_values(run.path)
    steps = server.req("GET", f"/runs/{run.id}/metrics", params={"type": "train"}).json()["points"]
    assert [p["step"] for p in steps] == list(range(40))


def test_conflict_strategies_for_another_run_of_the_same_name(server: Server, tmp_path: Path) -> None:
    a, _ = train_tiny(tmp_path / "a", steps=2, name="same")
    b, _ = train_tiny(tmp_path / "b", steps=2, name="same")
    a.finish()
    b.finish()
    client = _client(server)
    upload_run(a.path, folder="c", make_folder=True, client=client, artifacts=False)
    with pytest.raises(UploadError, match="409"):
        upload_run(b.path, folder="c", conflict_strategy="error", client=client)
    assert upload_run(b.path, folder="c", conflict_strategy="skip", client=client)["action"] == "skipped"
    assert server.req("GET", f"/runs/{b.id}").status_code == 404
    assert (
        upload_run(b.path, folder="c", conflict_strategy="replace", client=client, artifacts=False)["action"]
        == "created"
    )
    assert server.req("GET", f"/runs/{a.id}").status_code == 404
    assert (
        upload_run(a.path, folder="c", conflict_strategy="new", client=client, artifacts=False)["action"] == "created"
    )
    runs = server.req("GET", "/folders", params={"path": "c"}).json()["runs"]
    assert sorted(r["id"] for r in runs) == sorted([a.id, b.id])


def test_only_missing_blobs_are_sent(server: Server, tmp_path: Path) -> None:
    run, _ = train_tiny(tmp_path / "store", steps=2)
    run.finish()
    sent: list[str] = []

    class Spy:
        def request(self, method: str, url: str, **kwargs: Any) -> Any:
            sent.append(f"{method} {url.split('/')[3]}")
            return server.client.request(method, url, **kwargs)

    upload_run(run.path, client=_client(server, http=Spy()))
    assert sent.count("PUT blobs") == 1
    sent.clear()
    upload_run(run.path, client=_client(server, http=Spy()))
    assert sent.count("PUT blobs") == 0


def test_the_migration_creates_exactly_the_models_schema(server: Server) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from ember.server.storage.models import Base

    with server.client.app.state.engine.connect() as conn, warnings.catch_warnings():
        # SQLite cannot reflect the expression index of migration 0005: test_folder_pages checks it.
        warnings.filterwarnings("ignore", message=".*expression-based index ix_runs_folder_start")
        warnings.filterwarnings("ignore", message=".*expression-based index 'ix_runs_folder_start'")
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_bad_requests_get_a_json_error_never_a_500(tmp_path: Path, db_url: str) -> None:
    srv = make_server(tmp_path, db_url, max_body_bytes=20_000, max_blob_bytes=1000)
    rid = "9" * 32
    ok = srv.req("PUT", f"/runs/{rid}", json={"run": {"id": rid, "name": "r", "status": "Running"}})
    assert ok.status_code == 200
    cases = [
        (
            "POST",
            f"/runs/{rid}/metrics",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
        ),
        ("POST", f"/runs/{rid}/metrics", {"json": {"type": "train", "start": "0", "end": 1, "points": []}}, 422),
        (
            "POST",
            f"/runs/{rid}/metrics",
            {"json": {"type": "train", "start": 0, "end": 1, "points": [{"step": -1, "time": 0.0, "metrics": {}}]}},
            422,
        ),
        (
            "POST",
            f"/runs/{rid}/metrics",
            {
                "json": {
                    "type": "train",
                    "start": 0,
                    "end": 1,
                    "points": [{"step": 1, "time": 0.0, "metrics": {"x": "high"}}],
                }
            },
            422,
        ),
        ("POST", f"/runs/{rid}/metrics", {"json": {"type": "train", "start": 50, "end": 60, "points": []}}, 409),
        ("POST", f"/runs/{rid}/metrics", {"json": [1, 2, 3]}, 422),
        ("POST", f"/runs/{rid}/metrics", {"json": {"type": "../x", "start": 0, "end": 1, "points": []}}, 422),
        ("PUT", f"/runs/{rid}", {"json": {"run": {"id": "8" * 32, "name": "r", "status": "Running"}}}, 422),
        ("PUT", f"/runs/{rid}", {"json": {"run": {"id": rid, "name": "r", "status": "Sleeping"}}}, 422),
        ("PUT", f"/runs/{rid}", {"json": {"run": {"id": rid, "name": "r", "status": "Running", "hparams": [1]}}}, 422),
        ("GET", f"/runs/{'7' * 32}", {}, 404),
        ("POST", f"/runs/{'7' * 32}/metrics", {"json": {"type": "train", "start": 0, "end": 1, "points": []}}, 404),
        ("POST", f"/runs/{rid}/log", {"json": {"start": 0, "end": 1, "text": "x" * 30_000}}, 413),
        ("PUT", f"/blobs/{'0' * 64}", {"content": b"x" * 2000}, 413),
        ("PUT", f"/blobs/{'0' * 64}", {"content": b"x" * 10}, 422),
        (
            "PUT",
            f"/artifacts/{'6' * 32}",
            {
                "json": {
                    "artifact": {"id": "6" * 32, "name": "a", "files": [{"path": "f", "size": 1, "sha256": "0" * 64}]}
                }
            },
            409,
        ),
        ("GET", "/nowhere", {}, 404),
    ]
    for method, path, kwargs, status in cases:
        headers = {**srv.h(), **kwargs.pop("headers", {})}
        r = srv.client.request(method, f"/api/v1{path}", headers=headers, **kwargs)
        assert r.status_code == status, (method, path, r.status_code, r.text[:300])
        body = r.json()
        assert isinstance(body["detail"], str) and body["detail"], body
        assert "Traceback" not in r.text
    # a streamed (chunked) body over the limit is cut off with the same 413
    chunks = iter([b'{"type": "train", "start": 0, "end": 1, "points": [' + b" " * 30_000 + b"]}"])
    r = srv.client.post(f"/api/v1/runs/{rid}/metrics", headers=srv.h(), content=chunks)
    assert r.status_code == 413 and "limit" in r.json()["detail"]
    srv.client.app.state.engine.dispose()


def test_the_last_stdout_line_without_a_newline_is_uploaded(server: Server, tmp_path: Path) -> None:
    run, _ = train_tiny(tmp_path / "store", steps=10)
    print("done, no newline", end="")
    run.finish()
    log = run.path / "stdout.log"
    assert log.read_bytes().endswith(b"done, no newline")
    upload_run(run.path, client=_client(server))
    assert server.req("GET", f"/runs/{run.id}/log").json()["text"] == log.read_text()
    with open(log, "ab") as f:  # a character cut in the middle of its bytes waits for the rest
        f.write(" caf\u00e9".encode()[:-1])
    upload_run(run.path, client=_client(server))
    assert server.req("GET", f"/runs/{run.id}").json()["cursors"]["stdout.log"] == log.stat().st_size - 1
    with open(log, "ab") as f:
        f.write(b"\xa9 ok\n")
    upload_run(run.path, client=_client(server))
    assert server.req("GET", f"/runs/{run.id}/log").json()["text"] == log.read_text()
    assert log.read_text().endswith("done, no newline caf\u00e9 ok\n")


def test_a_request_whose_connection_dropped_is_sent_again(server: Server, tmp_path: Path) -> None:
    """Issue 17, item 11: a kept-alive connection the server closed fails once, then the request goes again."""
    import httpx

    class DropsFirst:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def request(self, method: str, url: str, **kwargs: Any) -> Any:
            self.calls.append(f"{method} {url}")
            if len(self.calls) == 1:
                content = kwargs.get("content")
                if content is not None and hasattr(content, "read"):
                    content.read(3)  # part of the body went out before the connection dropped
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            return server.client.request(method, url, **kwargs)

    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"0123456789" * 100)
    http = DropsFirst()
    with open(blob, "rb") as f:
        answer = _client(server, http=http).call("PUT", f"/blobs/{sha256(blob)}", content=f)
    assert answer["size"] == 1000 and len(http.calls) == 2
