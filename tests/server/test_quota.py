"""The storage quota (``--quota-mb``) under requests sent at once, and what its check costs.

Every road that adds bytes to a user's storage (metric points, run output, images, blob uploads,
artifacts listing blobs) locks the owner's ``users`` row first, then checks: requests sent at once
take turns, on PostgreSQL too, and none deadlocks. The check reads the owner's bound
(``users.stored_bytes``, never below their usage) and adds what the request stored; only a bound
past the quota makes it sum the owner's whole store, so a metrics batch costs the same whatever
the owner holds.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, select, text

from tests.server.conftest import Server, make_server

UNIT = 1024  # bytes each racing request adds: 8 metric points, 1 KiB of output, a 1 KiB image or blob


def _run(server: Server, run_id: str, folder: str = "runs") -> None:
    body = {"run": {"id": run_id, "name": run_id[:8], "status": "Running"}, "folder": folder, "make_folder": True}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200


def _points(start: int, count: int, first_step: int = 0) -> dict[str, Any]:
    steps = list(range(first_step, first_step + count))
    return {
        "type": "train",
        "start": start,
        "end": start + 10,
        "step": steps,
        "epoch": [None] * count,
        "time": [1.0] * count,
        "metrics": {"loss": [0.5] * count},
    }


def _png(size: int) -> str:
    """A file the server takes as a PNG (signature, IHDR, 1 x 1 pixels) of exactly ``size`` bytes."""
    head = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + (1).to_bytes(4, "big") * 2
    return base64.b64encode(head + b"\x00" * (size - len(head))).decode()


def _blob(server: Server, data: bytes, user: str = "alice") -> str:
    sha = hashlib.sha256(data).hexdigest()
    assert server.req("PUT", f"/blobs/{sha}", user=user, content=data).status_code == 200
    return sha


def _artifact(name: str, sha: str, size: int, folder: str) -> tuple[str, dict[str, Any]]:
    artifact_id = hashlib.md5(name.encode()).hexdigest()
    files = [{"path": "f.bin", "size": size, "sha256": sha}]
    return artifact_id, {"artifact": {"id": artifact_id, "name": name, "files": files}, "folder": folder}


def _usage(server: Server, name: str = "alice") -> int:
    from ember.server.services.blobs import usage
    from ember.server.storage.models import User

    with server.client.app.state.sessions() as session:
        user_id = session.scalars(select(User.id).where(User.name == name)).one()
        return usage(session, user_id)


def test_requests_sent_at_once_never_take_a_user_past_the_quota(tmp_path: Path, db_url: str) -> None:
    """Fifteen requests of every road that adds bytes, at once, each adding 1 KiB to alice's
    storage with room for 3 KiB: exactly three are stored, the rest refused, none fails otherwise
    (a deadlock would be a 500 on PostgreSQL), and writes that add nothing (new runs, deletions)
    sent with them all pass. Before, on PostgreSQL each request summed alice's usage in its own
    transaction, saw room for itself, and 6 to 8 were stored."""
    server = make_server(tmp_path, db_url, quota_bytes=3 * UNIT)
    with server.client:
        server.add_user("bob")
        runs = [f"{i:032x}" for i in range(1, 11)]  # the last one is deleted in the race
        for run_id in runs:
            _run(server, run_id)
        grant = {"kind": "folder", "target": "/alice/runs", "grantee": "bob", "level": "edit"}
        assert server.req("PUT", "/shares", json=grant).status_code == 200
        # bob's uploads wait in *his* storage; listed by artifacts in alice's folder they count in hers
        bobs = [_blob(server, bytes([i]) * UNIT, user="bob") for i in (1, 2)]
        empty, body = _artifact("empty", bobs[0], UNIT, "runs")
        body["artifact"]["files"] = []
        assert server.req("PUT", f"/artifacts/{empty}", json=body).status_code == 200
        assert _usage(server) == 0
        image = {"start": 0, "end": 10, "images": [{"name": "x", "step": 0, "time": 1.0, "png": _png(UNIT)}]}
        sends: list[tuple[str, str, str, dict[str, Any]]] = []
        sends += [("alice", "POST", f"/runs/{r}/metrics", {"json": _points(0, UNIT // 128)}) for r in runs[:4]]
        sends.append(
            ("alice", "POST", f"/runs/{runs[0]}/metrics", {"json": {**_points(0, UNIT // 128), "type": "val"}})
        )
        sends += [
            ("alice", "POST", f"/runs/{r}/log", {"json": {"start": 0, "end": UNIT, "text": "x" * UNIT}})
            for r in runs[4:7]
        ]
        sends += [("alice", "POST", f"/runs/{r}/images", {"json": image}) for r in runs[7:9]]
        for i in (3, 4, 5):
            data = bytes([i]) * UNIT
            sends.append(("alice", "PUT", f"/blobs/{hashlib.sha256(data).hexdigest()}", {"content": data}))
        for i, sha in enumerate(bobs):
            artifact_id, body = _artifact(f"a{i}", sha, UNIT, "/alice/runs")
            sends.append(("bob", "PUT", f"/artifacts/{artifact_id}", {"json": body}))
        racing = len(sends)
        new = {"name": "new", "status": "Running"}
        sends += [  # writes that add no bytes, taking the same locks: they pass
            ("alice", "PUT", f"/runs/{'e1' * 16}", {"json": {"run": {**new, "id": "e1" * 16}, "folder": "runs"}}),
            ("bob", "PUT", f"/runs/{'e2' * 16}", {"json": {"run": {**new, "id": "e2" * 16}, "folder": "/alice/runs"}}),
            ("alice", "DELETE", f"/artifacts/{empty}", {}),
            ("alice", "DELETE", f"/runs/{runs[9]}", {"params": {"purge": "true"}}),
        ]
        start = threading.Barrier(len(sends))

        def send(request: tuple[str, str, str, dict[str, Any]]) -> int:
            user, method, path, kwargs = request
            start.wait()
            return int(server.req(method, path, user=user, **kwargs).status_code)

        with ThreadPoolExecutor(len(sends)) as pool:
            codes = list(pool.map(send, sends))
        told = list(zip(codes, [s[2] for s in sends], strict=True))
        assert sorted(codes[:racing]) == [200] * 3 + [413] * (racing - 3), told
        assert codes[racing:] == [200] * 4, told
        assert _usage(server) == 3 * UNIT
        assert _usage(server, "bob") == sum(
            UNIT for code, s in zip(codes[:racing], sends, strict=False) if s[0] == "bob" and code == 413
        )
    server.client.app.state.engine.dispose()


def _bound(server: Server, name: str = "alice") -> int | None:
    with server.client.app.state.engine.connect() as conn:
        found = conn.execute(text("SELECT stored_bytes FROM users WHERE name = :n"), {"n": name}).scalar_one()
    return None if found is None else int(found)


def _statements(server: Server) -> Iterator[list[str]]:
    """The SQL the server runs while the ``with`` block sends requests."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    engine = server.client.app.state.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


watch = contextmanager(_statements)


def test_the_quota_check_adds_to_a_bound_that_stays_above_the_usage_as_bytes_come_and_go(
    tmp_path: Path, db_url: str
) -> None:
    """The owner's bound (``users.stored_bytes``) is raised by what each write adds and left alone by
    what frees bytes; a batch is summed against the whole store only when the bound leaves no room,
    so a refusal is always exact and a metrics batch reads none of the owner's artifacts."""
    from ember.server.services.blobs import collect
    from ember.server.storage.models import now

    server = make_server(tmp_path, db_url, quota_bytes=20 * UNIT)
    app = server.client.app

    def fits() -> None:  # the invariant: never below the usage
        for name in ("alice", "bob"):
            bound = _bound(server, name)
            assert bound is None or bound >= _usage(server, name), (name, bound, _usage(server, name))

    with server.client:
        server.add_user("bob")
        run = f"{1:032x}"
        _run(server, run)
        grant = {"kind": "folder", "target": "/alice/runs", "grantee": "bob", "level": "edit"}
        assert server.req("PUT", "/shares", json=grant).status_code == 200
        assert _bound(server) is None  # not known yet: the first check sums the store
        assert server.req("POST", f"/runs/{run}/metrics", json=_points(0, 8)).status_code == 200
        assert _bound(server) == _usage(server) == UNIT
        # an upload counts once: pending, then listed by the owner's artifact
        own = _blob(server, b"a" * 4 * UNIT)
        artifact_id, body = _artifact("mine", own, 4 * UNIT, "runs")
        assert server.req("PUT", f"/artifacts/{artifact_id}", json=body).status_code == 200
        assert _bound(server) == _usage(server) == 5 * UNIT
        # with room in the bound, a metrics batch touches no artifact, upload or image: one statement checks
        with watch(server) as seen:
            assert server.req("POST", f"/runs/{run}/metrics", json=_points(10, 8, first_step=8)).status_code == 200
        assert seen and not [s for s in seen if "artifact_files" in s or "blob_uploads" in s or "run_images" in s]
        assert _bound(server) == _usage(server) == 6 * UNIT
        # freeing bytes leaves the bound: deleting the artifact collects its blob
        assert server.req("DELETE", f"/artifacts/{artifact_id}").status_code == 200
        assert _bound(server) == 6 * UNIT and _usage(server) == 2 * UNIT
        # 17 KiB more: past the bound's room, so the store is summed (and seen to fit) and the bound exact again
        with watch(server) as seen:
            assert (
                server.req("POST", f"/runs/{run}/metrics", json=_points(20, 17 * 8, first_step=16)).status_code == 200
            )
        assert [s for s in seen if "artifact_files" in s]
        assert _bound(server) == _usage(server) == 19 * UNIT
        refused = server.req("POST", f"/runs/{run}/metrics", json=_points(30, 16, first_step=1000))
        assert refused.status_code == 413 and "--quota-mb" in refused.json()["detail"]
        assert _usage(server) == 19 * UNIT
        # another user's upload listed in alice's folder: it leaves bob's usage (his bound stays) and joins alice's
        theirs = _blob(server, b"b" * UNIT, user="bob")
        assert _bound(server, "bob") == _usage(server, "bob") == UNIT
        artifact_id, body = _artifact("bobs", theirs, UNIT, "/alice/runs")
        assert server.req("PUT", f"/artifacts/{artifact_id}", json=body, user="bob").status_code == 200
        assert _bound(server) == _usage(server) == 20 * UNIT
        assert _bound(server, "bob") == UNIT and _usage(server, "bob") == 0
        fits()
        # output and images count; a pending upload whose grace period is over is collected
        assert server.req("DELETE", f"/runs/{run}", params={"purge": "true"}).status_code == 200
        assert _usage(server) == UNIT
        second = f"{2:032x}"
        _run(server, second)
        log = {"start": 0, "end": UNIT, "text": "x" * UNIT}
        assert server.req("POST", f"/runs/{second}/log", json=log).status_code == 200
        image = {"start": 0, "end": 10, "images": [{"name": "x", "step": 0, "time": 1.0, "png": _png(2 * UNIT)}]}
        assert server.req("POST", f"/runs/{second}/images", json=image).status_code == 200
        _blob(server, b"c" * 3 * UNIT)  # pending: no artifact lists it
        assert _usage(server) == 7 * UNIT
        fits()
        with app.state.sessions() as session, session.begin():
            assert collect(session, app.state.blobs, at=now() + timedelta(days=2)) == 1
        assert _usage(server) == 4 * UNIT
        fits()
        # a write without a quota forgets the bound; a quota set again starts from the exact sum
        app.state.settings = dataclasses.replace(app.state.settings, quota_bytes=None)
        assert server.req("POST", f"/runs/{second}/metrics", json=_points(0, 8)).status_code == 200
        assert _bound(server) is None
        app.state.settings = dataclasses.replace(app.state.settings, quota_bytes=20 * UNIT)
        assert server.req("POST", f"/runs/{second}/metrics", json=_points(10, 8, first_step=8)).status_code == 200
        assert _bound(server) == _usage(server) == 6 * UNIT
    server.client.app.state.engine.dispose()
