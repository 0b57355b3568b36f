"""Blobs are private, unreferenced ones are removed, a user's storage has a quota (issue 17, item 2).

Before: anyone who knew (or guessed) a file's sha256 could list it in an artifact of their own
and download the bytes, and ``POST /blobs/missing`` told anyone whether a file was stored.
"""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from ember.server.app import collect_blobs
from ember.server.services.blobs import collect
from ember.server.storage.models import now
from tests.server.conftest import Server, make_server


def _blob(server: Server, user: str, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    r = server.req("PUT", f"/blobs/{sha}", user=user, content=data)
    assert r.status_code == 200, r.text
    return sha


def _artifact(server: Server, user: str, aid: str, files: dict[str, bytes], folder: str = "default") -> Any:
    listed = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in files.items()]
    body = {"folder": folder, "make_folder": True, "artifact": {"id": aid, "name": f"a{aid[:4]}", "files": listed}}
    return server.req("PUT", f"/artifacts/{aid}", user=user, json=body)


def _stored(server: Server, sha: str) -> bool:
    path = server.settings.data_dir / "blobs" / sha[:2] / sha[2:4] / sha
    with server.client.app.state.engine.connect() as conn:
        row = conn.execute(text("SELECT count(*) FROM blobs WHERE sha256 = :s"), {"s": sha}).scalar_one()
    assert path.is_file() == bool(row), (path.is_file(), row)
    return bool(row)


A, B, C = "a" * 32, "b" * 32, "c" * 32


def test_a_digest_gives_no_access_to_another_users_bytes(server: Server) -> None:
    secret = b"alice's private weights " + os.urandom(64)
    sha = _blob(server, "alice", secret)
    assert _artifact(server, "alice", A, {"model.pt": secret}).status_code == 200
    unknown = hashlib.sha256(b"never uploaded by anyone").hexdigest()
    # bob learns nothing from `missing`: alice's digest is as missing as one nobody uploaded
    assert server.req("POST", "/blobs/missing", user="bob", json={"sha256": [sha, unknown]}).json() == {
        "missing": sorted([sha, unknown])
    }
    assert server.req("POST", "/blobs/missing", json={"sha256": [sha]}).json() == {"missing": []}
    # ... and cannot list it in an artifact of his own: the same 409 as for bytes nobody has
    stolen = _artifact(server, "bob", B, {"loot.pt": secret})
    never = _artifact(server, "bob", C, {"x": b"never uploaded by anyone"})
    assert stolen.status_code == never.status_code == 409
    assert stolen.json()["detail"].replace(sha, "D") == never.json()["detail"].replace(unknown, "D")
    assert server.req("GET", f"/artifacts/{B}/files/loot.pt", user="bob").status_code == 404
    # once alice shares the artifact, bob may list the bytes he can already read
    share = {"kind": "artifact", "target": A, "grantee": "bob", "level": "view"}
    assert server.req("PUT", "/shares", json=share).status_code == 200
    assert _artifact(server, "bob", B, {"copy.pt": secret}).status_code == 200
    assert server.req("GET", f"/artifacts/{B}/files/copy.pt", user="bob").content == secret
    # carol, who uploads the same bytes herself, proves she has them
    assert _blob(server, "carol", secret) == sha
    assert _artifact(server, "carol", C, {"mine.pt": secret}).status_code == 200


def test_unreferenced_blobs_go_after_the_grace_period_or_with_their_last_artifact(server: Server) -> None:
    app = server.client.app
    kept, shared, orphan = b"kept" * 100, b"shared" * 100, b"orphan" * 100
    for data in (kept, shared, orphan):
        _blob(server, "alice", data)
    assert _artifact(server, "alice", A, {"k": kept, "s": shared}).status_code == 200
    assert _artifact(server, "alice", B, {"s": shared}).status_code == 200
    sha = {d: hashlib.sha256(d).hexdigest() for d in (kept, shared, orphan)}
    assert collect_blobs(app) == 0  # the orphan's upload is still in its grace period
    later = now() + timedelta(seconds=server.settings.blob_grace_s + 1)
    with app.state.sessions() as session, session.begin():
        assert collect(session, app.state.blobs, at=later) == 1
    assert not _stored(server, sha[orphan]) and _stored(server, sha[kept]) and _stored(server, sha[shared])
    # deleting an artifact removes at once the blobs no other artifact lists
    assert server.req("DELETE", f"/artifacts/{A}").status_code == 200
    assert not _stored(server, sha[kept]) and _stored(server, sha[shared])
    assert server.req("DELETE", f"/artifacts/{B}").status_code == 200
    assert not _stored(server, sha[shared])
    # a blob dropped from an artifact's file list goes too
    _blob(server, "alice", kept)
    _blob(server, "alice", orphan)
    assert _artifact(server, "alice", C, {"k": kept, "o": orphan}).status_code == 200
    assert _artifact(server, "alice", C, {"k": kept}).status_code == 200
    assert not _stored(server, sha[orphan]) and _stored(server, sha[kept])
    assert [f["path"] for f in server.req("GET", f"/artifacts/{C}").json()["files"]] == ["k"]


def test_a_users_storage_has_a_quota(tmp_path: Path, db_url: str) -> None:
    server = make_server(tmp_path, db_url, quota_bytes=100_000)
    with server.client:
        first, second = os.urandom(60_000), os.urandom(60_000)
        _blob(server, "alice", first)
        assert _artifact(server, "alice", A, {"first": first}).status_code == 200
        sha = hashlib.sha256(second).hexdigest()
        over = server.req("PUT", f"/blobs/{sha}", content=second)
        assert over.status_code == 413 and "quota" in over.json()["detail"], over.text
        assert not (server.settings.data_dir / "blobs" / sha[:2] / sha[2:4] / sha).exists()
        assert server.req("DELETE", f"/artifacts/{A}").status_code == 200
        _blob(server, "alice", second)  # room again
    server.client.app.state.engine.dispose()
