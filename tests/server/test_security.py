"""Security (issue 8, item 3): keys on every route, sharing rules, path tricks, no writes outside --data."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import select, text

from ember.server import API_PREFIX
from ember.server.app import iter_routes
from ember.track.client import Client, Credentials, UploadError, upload_artifact
from tests.server._runs import train_tiny
from tests.server.conftest import Server

PUBLIC_DOCS = {f"{API_PREFIX}/openapi.json", f"{API_PREFIX}/docs", "/docs/oauth2-redirect"}
RUN = "1" * 32


def api_routes(app) -> list[tuple[str, str]]:
    """Every (method, path) the app serves under /api/v1, path parameters filled in."""
    out = []
    for path, methods in iter_routes(app):
        if path in PUBLIC_DOCS or not path.startswith(API_PREFIX):
            continue
        concrete = re.sub(r"\{sha256\}", "a" * 64, path)
        concrete = re.sub(r"\{path:path\}", "f.txt", concrete)
        concrete = re.sub(r"\{[a-z_]+\}", RUN, concrete)
        out += [(m, concrete) for m in sorted(methods - {"HEAD", "OPTIONS"})]
    return out


def test_every_route_refuses_a_missing_or_wrong_key(server: Server) -> None:
    routes = api_routes(server.client.app)
    assert len(routes) >= 18, routes
    revoked = server.add_user("dave")
    server.req("DELETE", f"/keys/{revoked.split('_')[1]}", user="dave")
    near = server.keys["alice"][:-1] + ("A" if server.keys["alice"][-1] != "A" else "B")
    for method, path in routes:
        for headers in (
            {},
            {"Authorization": "Bearer"},
            {"Authorization": "Basic " + server.keys["alice"]},
            {"Authorization": "Bearer ember_0000000000000000_" + "x" * 43},
            {"Authorization": f"Bearer {near}"},
            {"Authorization": f"Bearer {revoked}"},
        ):
            r = server.client.request(method, path, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.text)
            assert "detail" in r.json()


def test_keys_are_stored_hashed_and_expire(server: Server) -> None:
    with server.client.app.state.engine.connect() as conn:
        dump = " ".join(str(row) for row in conn.execute(text("SELECT * FROM api_keys")))
    secret = server.keys["alice"].split("_", 2)[2]  # the secret itself may contain "_"
    assert server.keys["alice"] not in dump and secret not in dump
    key = server.req("POST", "/keys", json={"label": "short", "expires_days": 0.000001}).json()["key"]
    import time

    time.sleep(0.5)
    assert server.client.get(f"{API_PREFIX}/me", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def _upload_run(server: Server, user: str, folder: str, run_id: str = RUN) -> None:
    body = {"folder": folder, "make_folder": True, "run": {"id": run_id, "name": "r", "status": "Complete"}}
    assert server.req("PUT", f"/runs/{run_id}", user=user, json=body).status_code == 200


def _points(step: int) -> dict:
    return {"type": "train", "start": 0, "end": 10, "points": [{"step": step, "time": 1.0, "metrics": {"x": 1.0}}]}


def test_sharing_view_and_edit_are_inherited_from_folders(server: Server) -> None:
    _upload_run(server, "alice", "private/deep")
    # bob sees nothing of alice's
    assert server.req("GET", f"/runs/{RUN}", user="bob").status_code == 404
    assert server.req("GET", "/folders", user="bob", params={"path": "/alice/private"}).status_code == 404
    assert server.req("POST", f"/runs/{RUN}/metrics", user="bob", json=_points(1)).status_code == 404
    body = {"folder": "/alice/private", "run": {"id": "2" * 32, "name": "b", "status": "Complete"}}
    assert server.req("PUT", f"/runs/{'2' * 32}", user="bob", json=body).status_code == 404
    # bob may not share alice's folder with himself
    share = {"kind": "folder", "target": "/alice/private", "grantee": "bob", "level": "view"}
    assert server.req("PUT", "/shares", user="bob", json=share).status_code == 404
    # shared as view (on the parent folder): bob reads, cannot write
    assert server.req("PUT", "/shares", json=share).status_code == 200
    assert server.req("GET", f"/runs/{RUN}", user="bob").status_code == 200
    assert server.req("GET", "/folders", user="bob", params={"path": "/alice/private/deep"}).status_code == 200
    assert server.req("POST", f"/runs/{RUN}/metrics", user="bob", json=_points(1)).status_code == 403
    assert server.req("PUT", f"/runs/{'2' * 32}", user="bob", json=body).status_code == 403
    assert server.req("DELETE", f"/runs/{RUN}", user="bob").status_code == 403
    assert server.req("PUT", "/shares", user="bob", json={**share, "grantee": "carol"}).status_code == 403
    assert server.req("GET", f"/runs/{RUN}", user="carol").status_code == 404
    # edit: bob writes
    assert server.req("PUT", "/shares", json={**share, "level": "edit"}).status_code == 200
    assert server.req("POST", f"/runs/{RUN}/metrics", user="bob", json=_points(1)).status_code == 200
    assert server.req("PUT", f"/runs/{'2' * 32}", user="bob", json=body).status_code == 200
    # public view of one run only
    pub = {"kind": "run", "target": RUN, "grantee": "*", "level": "view"}
    assert server.req("PUT", "/shares", json=pub).status_code == 200
    assert server.req("GET", f"/runs/{RUN}", user="carol").status_code == 200
    assert server.req("GET", f"/runs/{'2' * 32}", user="carol").status_code == 404
    # un-sharing takes it back
    assert server.req("PUT", "/shares", json={**share, "level": "none"}).status_code == 200
    assert server.req("GET", "/folders", user="bob", params={"path": "/alice/private"}).status_code == 404
    assert server.req("POST", f"/runs/{RUN}/metrics", user="bob", json=_points(2)).status_code == 403  # public view
    assert server.req("GET", f"/runs/{'2' * 32}", user="bob").status_code == 200  # bob made it: his
    # no open sign-up: only admins add users
    assert server.req("POST", "/users", user="bob", json={"name": "mallory"}).status_code == 403


TRICKS = [
    "../x",
    "..\\x",
    "a/../../x",
    "%2e%2e/x",
    "%2e%2e%2fx",
    "%252e%252e%252fx",
    "..%2fx",
    "..%5cx",
    "/etc/passwd",
    "/tmp/evil",
    "C:\\evil",
    "C:/evil",
    "a#b",
    "a?b",
    "a\x00b",
    "x" * 10_000,
    ".",
    "..",
    "",
]


def _tree(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


def test_path_tricks_are_refused_everywhere_and_nothing_is_written_outside_data(server: Server, tmp_path: Path) -> None:
    data = server.settings.data_dir
    outside_before = _tree(tmp_path) - _tree(data)
    blob = b"payload"
    sha = hashlib.sha256(blob).hexdigest()
    assert server.req("PUT", f"/blobs/{sha}", content=blob).status_code == 200
    aid = "a" * 32
    art = {"id": aid, "name": "m", "files": [{"path": "ok.bin", "size": len(blob), "sha256": sha}]}
    assert server.req("PUT", f"/artifacts/{aid}", json={"artifact": art}).status_code == 200
    _upload_run(server, "alice", "safe")
    for trick in TRICKS:
        run_body = {"folder": trick, "make_folder": True, "run": {"id": "3" * 32, "name": "r", "status": "Complete"}}
        named = {"folder": "safe", "run": {"id": "4" * 32, "name": trick, "status": "Complete"}}
        bad_file = {**art, "files": [{"path": trick, "size": len(blob), "sha256": sha}]}
        bad_ref = {**art, "references": [{"uri": "s3://b/x", "path": trick}]}
        edge = {
            "time": 1.0,
            "source": {"kind": "run", "id": trick, "name": "r"},
            "target": {"kind": "run", "id": RUN, "name": "r"},
        }
        attempts = [
            ("PUT", f"/runs/{'3' * 32}", {"json": run_body}),
            ("PUT", f"/runs/{'4' * 32}", {"json": named}),
            ("GET", "/folders", {"params": {"path": trick}}),
            ("POST", "/folders", {"json": {"path": trick, "parents": True}}),
            ("POST", "/folders", {"json": {"path": f"/alice/{trick}", "parents": True}}),
            ("PUT", f"/artifacts/{aid}", {"json": {"artifact": bad_file}}),
            ("PUT", f"/artifacts/{aid}", {"json": {"artifact": bad_ref}}),
            (
                "PUT",
                f"/artifacts/{'5' * 32}",
                {"json": {"folder": trick, "make_folder": True, "artifact": {**art, "id": "5" * 32}}},
            ),
            ("GET", f"/artifacts/{aid}/files/{trick}", {}),
            ("PUT", f"/blobs/{trick}", {"content": blob}),
            ("POST", "/blobs/missing", {"json": {"sha256": [trick]}}),
            ("GET", f"/runs/{trick}", {}),
            ("PUT", "/shares", {"json": {"kind": "folder", "target": trick, "grantee": "bob", "level": "view"}}),
            ("PUT", "/shares", {"json": {"kind": "run", "target": RUN, "grantee": trick, "level": "view"}}),
            ("POST", "/users", {"json": {"name": trick}}),
            ("POST", f"/runs/{RUN}/lineage", {"json": {"start": 0, "end": 1, "edges": [edge]}}),
        ]
        if not trick:
            attempts = [a for a in attempts if a[2] != {"json": {"path": "/alice/", "parents": True}}]  # = home
        for method, path, kwargs in attempts:
            # In a URL the trick is sent percent-encoded, so that it reaches the route as it is
            # (a client would otherwise resolve '..' itself).
            path = path.replace(trick, quote(trick, safe="").replace(".", "%2E")) if trick else path
            r = server.req(method, path, **kwargs)
            assert 400 <= r.status_code < 500, (trick[:30], method, path[:80], r.status_code, r.text[:200])
            assert isinstance(r.json()["detail"], str)
    assert _tree(tmp_path) - _tree(data) == outside_before
    blobs = [p for p in (data / "blobs").rglob("*") if p.is_file()]
    assert [p.name for p in blobs] == [sha]
    with server.client.app.state.engine.connect() as conn:
        paths = [p for (p,) in conn.execute(text("SELECT path FROM folders"))]
    assert all(re.fullmatch(r"/[a-z]+(/[A-Za-z0-9_. -]+)*", p) and ".." not in p for p in paths), paths


def test_a_symlink_inside_an_artifact_is_not_uploaded(server: Server, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not upload")
    run, _ = train_tiny(tmp_path / "store", steps=2)
    run.finish()
    art_dir = next((tmp_path / "store" / "artifacts").iterdir())
    stored = art_dir / "files" / "model.pt"
    stored.unlink()
    os.symlink(secret, stored)
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
    with pytest.raises(UploadError, match="symbolic link"):
        upload_artifact(art_dir, client=client)
    assert not any(p.is_file() for p in (server.settings.data_dir / "blobs").rglob("*"))
    with server.client.app.state.engine.connect() as conn:
        assert conn.execute(select(text("count(*)")).select_from(text("artifacts"))).scalar() == 0
