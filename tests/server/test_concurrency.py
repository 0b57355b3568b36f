"""A real server process under concurrent requests (issue 17, items 1 and 11).

Item 1: a blob upload used to run its SQLite transaction on the event loop; while another
writer held the lock it waited there, and every other request of the process (even
``/openapi.json``) waited with it. Item 11: a 500 used to close the connection, so the client's
next request on it failed with "connection reset".
"""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ember.server.services import admin
from ember.server.storage.settings import Settings
from tests.server.conftest import ServerProcess, free_port

RUN = "c" * 32


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, Path]]:
    db = tmp_path / "server.db"
    settings = Settings.make(data_dir=tmp_path / "data", db_url=f"sqlite:///{db}")
    key = admin.init(settings, "alice")
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    try:
        yield proc, key, db
    finally:
        proc.kill()


def test_a_blob_upload_waiting_for_the_write_lock_stalls_no_other_request(
    sqlite_server: tuple[ServerProcess, str, Path],
) -> None:
    proc, key, db = sqlite_server
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=proc.url, headers=auth, timeout=30) as http:
        run = {"folder": "f", "make_folder": True, "run": {"id": RUN, "name": "r", "status": "Running"}}
        assert http.put(f"/api/v1/runs/{RUN}", json=run).status_code == 200
        batch = {"type": "train", "start": 0, "end": 1, "points": [{"step": 1, "time": 1.0, "metrics": {"x": 1.0}}]}
        assert http.post(f"/api/v1/runs/{RUN}/metrics", json=batch).status_code == 200
    data = os.urandom(64 << 10)
    sha = hashlib.sha256(data).hexdigest()
    holder = sqlite3.connect(db, isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds SQLite's write lock until the end
    answers: dict[str, int] = {}

    def upload() -> None:
        r = httpx.put(f"{proc.url}/api/v1/blobs/{sha}", content=data, headers=auth, timeout=60)
        answers["blob"] = r.status_code

    uploader = threading.Thread(target=upload)
    try:
        uploader.start()
        time.sleep(0.5)  # the upload has arrived and waits for the lock
        with httpx.Client(base_url=proc.url, headers=auth, timeout=5) as http:
            for path in ("/api/v1/openapi.json", "/api/v1/me", f"/api/v1/runs/{RUN}/series?type=train"):
                began = time.perf_counter()
                r = http.get(path)
                took = time.perf_counter() - began
                # before: each waited behind the blob upload, that is until the lock was released,
                # which happens only after these requests (so they timed out)
                assert r.status_code == 200 and took < 2.0, (path, r.status_code, f"{took:.2f} s")
        assert uploader.is_alive()  # still waiting for the lock: the others did not wait behind it
    finally:
        time.sleep(2.5)
        holder.execute("ROLLBACK")
        holder.close()
        uploader.join(60)
    assert answers == {"blob": 200}


def test_a_500_keeps_the_connection_open_for_the_next_request(tmp_path: Path) -> None:
    import uvicorn

    from ember.server.app import create_app

    app = create_app(Settings.make(data_dir=tmp_path / "data", db_url=f"sqlite:///{tmp_path / 'server.db'}"))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            answers = []
            for path in ("/boom", "/api/v1/openapi.json"):  # one connection, kept alive
                conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                answers.append(_read_response(conn))
        assert answers[0][0] == 500 and b"internal server error" in answers[0][1]
        assert b"Traceback" not in answers[0][1] and b"a bug" not in answers[0][1]
        assert answers[1][0] == 200 and b'"openapi"' in answers[1][1]
    finally:
        server.should_exit = True
        thread.join(10)


def _read_response(conn: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length from a socket: (status, body); (0, b"") when closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return 0, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return 0, b""
        body += chunk
    return int(lines[0].split()[1]), body


def test_sqlite_writers_take_turns_in_arrival_order_and_a_timed_out_one_leaves_the_queue() -> None:
    from ember.server.storage.db import WriterQueue

    queue = WriterQueue(timeout_s=0.3)
    first, late, third = object(), object(), object()
    queue.take(first)
    order: list[str] = []

    def wait(holder: object, name: str) -> None:
        try:
            queue.take(holder)
        except sqlite3.OperationalError as e:
            order.append(f"{name}: {e}")
            return
        order.append(name)
        queue.give_back(holder)

    timed_out = threading.Thread(target=wait, args=(late, "late"))
    timed_out.start()
    timed_out.join()
    assert order and order[0].startswith("late: database is locked")
    waiting = threading.Thread(target=wait, args=(third, "third"))
    waiting.start()
    time.sleep(0.1)
    assert order == order[:1]  # the third waits for the first, not for the one that left
    queue.give_back(first)
    waiting.join(5)
    assert order[1:] == ["third"]
