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
import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import select

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
    """Fourteen requests of every road that adds bytes, at once, each adding 1 KiB to alice's
    storage with room for 3 KiB: exactly three are stored, the rest refused, none fails otherwise
    (a deadlock would be a 500 on PostgreSQL). Before, on PostgreSQL each request summed alice's
    usage in its own transaction, saw room for itself, and most were stored."""
    server = make_server(tmp_path, db_url, quota_bytes=3 * UNIT)
    with server.client:
        server.add_user("bob")
        runs = [f"{i:032x}" for i in range(1, 10)]
        for run_id in runs:
            _run(server, run_id)
        grant = {"kind": "folder", "target": "/alice/runs", "grantee": "bob", "level": "edit"}
        assert server.req("PUT", "/shares", json=grant).status_code == 200
        # bob's uploads wait in *his* storage; listed by artifacts in alice's folder they count in hers
        bobs = [_blob(server, bytes([i]) * UNIT, user="bob") for i in (1, 2)]
        assert _usage(server) == 0
        image = {"start": 0, "end": 10, "images": [{"name": "x", "step": 0, "time": 1.0, "png": _png(UNIT)}]}
        sends: list[tuple[str, str, str, dict[str, Any]]] = []
        sends += [("alice", "POST", f"/runs/{r}/metrics", {"json": _points(0, UNIT // 128)}) for r in runs[:4]]
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
        start = threading.Barrier(len(sends))

        def send(request: tuple[str, str, str, dict[str, Any]]) -> int:
            user, method, path, kwargs = request
            start.wait()
            return int(server.req(method, path, user=user, **kwargs).status_code)

        with ThreadPoolExecutor(len(sends)) as pool:
            codes = list(pool.map(send, sends))
        assert sorted(codes) == [200] * 3 + [413] * (len(sends) - 3), list(
            zip(codes, [s[2] for s in sends], strict=True)
        )
        assert _usage(server) == 3 * UNIT
        assert _usage(server, "bob") == sum(
            UNIT for code, s in zip(codes, sends, strict=True) if s[0] == "bob" and code == 413
        )
    server.client.app.state.engine.dispose()
