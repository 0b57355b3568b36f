"""Security (issue 8, item 3): keys on every route, sharing rules, path tricks, no writes outside --data."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import select, text

from ember.server import API_PREFIX
from ember.server.app import iter_routes
from ember.track.client import Client, Credentials, UploadError, upload_artifact, upload_run
from tests.server._runs import train_tiny
from tests.server.conftest import Server, alembic_to

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


def test_a_key_made_with_a_key_can_do_no_more_than_its_maker(server: Server) -> None:
    """Issue 30, item 3: a key made with an expiring key expires no later, and goes when its maker is revoked."""
    from datetime import datetime

    def made(key: str, **body: object) -> dict:
        answer = server.client.post(f"{API_PREFIX}/keys", json=body, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
        return answer.json()

    def works(key: str) -> bool:
        return server.client.get(f"{API_PREFIX}/me", headers={"Authorization": f"Bearer {key}"}).status_code == 200

    short = made(server.keys["alice"], label="short", expires_days=1)
    limit = datetime.fromisoformat(short["expires"])
    assert short["made_with"] == server.keys["alice"].split("_")[1]
    child = made(short["key"], label="forever")  # asked for no expiry: gets its maker's (it used to be null)
    assert datetime.fromisoformat(child["expires"]) == limit
    longer = made(short["key"], label="longer", expires_days=30)
    assert datetime.fromisoformat(longer["expires"]) == limit
    sooner = made(short["key"], label="sooner", expires_days=0.5)
    assert datetime.fromisoformat(sooner["expires"]) < limit
    grandchild = made(child["key"], label="deeper")
    # an expiring admin key cannot make a lasting user either
    user = server.client.post(
        f"{API_PREFIX}/users",
        json={"name": "mallory", "admin": True},
        headers={"Authorization": f"Bearer {short['key']}"},
    ).json()
    assert datetime.fromisoformat(user["expires"]) == limit
    assert all(works(k) for k in (child["key"], grandchild["key"], user["key"]))
    # so a key made with a key about to expire expires with it (after the first key expired, the new one still
    # worked); that an expired key is refused is test_keys_are_stored_hashed_and_expire's
    brief = made(server.keys["alice"], label="brief", expires_days=1e-5)
    assert made(brief["key"], label="heir")["expires"] == brief["expires"]
    # revoking a key revokes what was made with it, at any depth
    top = made(server.keys["alice"], label="top")
    below = made(top["key"], label="below")
    bottom = made(below["key"], label="bottom")
    gone = server.req("DELETE", f"/keys/{top['key'].split('_')[1]}").json()
    assert gone == {"key_id": top["key"].split("_")[1], "revoked": True, "also": 2}
    assert not any(works(k["key"]) for k in (top, below, bottom)) and works(server.keys["alice"])
    listed = {k["label"]: k for k in server.req("GET", "/keys").json()["keys"]}
    assert listed["below"]["made_with"] == top["key"].split("_")[1] and listed["below"]["revoked"]


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
    # bob uploaded run 2 into alice's tree: it is alice's, and the revocation covers it too
    assert server.req("GET", f"/runs/{'2' * 32}", user="bob").status_code == 404
    assert server.req("GET", f"/runs/{'2' * 32}").json()["owner"] == "alice"
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


def test_revoking_a_share_revokes_it_for_the_whole_subtree(server: Server) -> None:
    """Issue 17, item 3: an editor's sub-folder inside a shared folder is the owner's, not the editor's."""
    assert server.req("POST", "/folders", json={"path": "shared", "parents": True}).status_code == 200
    edit = {"kind": "folder", "target": "/alice/shared", "grantee": "bob", "level": "edit"}
    assert server.req("PUT", "/shares", json=edit).status_code == 200
    sub_folder = {"path": "/alice/shared/sub", "parents": True}
    assert server.req("POST", "/folders", user="bob", json=sub_folder).status_code == 200
    _upload_run(server, "bob", "/alice/shared/sub", "2" * 32)
    _upload_run(server, "alice", "/alice/shared/sub", RUN)
    sub = server.req("GET", "/folders", params={"path": "/alice/shared/sub"}).json()
    assert sub["access"] == "own" and server.req("GET", f"/runs/{'2' * 32}").json()["owner"] == "alice"
    # bob edits, but may not share what he created there (the tree has one owner)
    to_carol = {"kind": "folder", "target": "/alice/shared/sub", "grantee": "carol", "level": "view"}
    assert server.req("PUT", "/shares", user="bob", json=to_carol).status_code == 403
    assert server.req("PUT", "/shares", user="bob", json={**to_carol, "grantee": "bob"}).status_code == 403
    # a grant alice made on the sub-folder goes with the revocation above it
    assert server.req("PUT", "/shares", json={**to_carol, "grantee": "bob"}).status_code == 200
    assert server.req("PUT", "/shares", json={**edit, "level": "none"}).status_code == 200
    for method, path, kwargs in [
        ("GET", "/folders", {"params": {"path": "/alice/shared/sub"}}),
        ("GET", f"/runs/{RUN}", {}),
        ("GET", f"/runs/{'2' * 32}", {}),
        ("PUT", "/shares", {"json": to_carol}),
        ("DELETE", f"/runs/{RUN}", {}),
        ("DELETE", f"/runs/{'2' * 32}", {}),
    ]:
        r = server.req(method, path, user="bob", **kwargs)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
    assert server.req("GET", "/search/runs", user="bob").json()["total"] == 0
    assert server.req("GET", f"/runs/{RUN}").status_code == 200


def test_migration_0004_gives_every_node_of_a_tree_to_its_homes_owner(db_url: str) -> None:
    from sqlalchemy import create_engine

    from ember.server.storage.db import make_engine, migrate

    url = db_url
    alembic_to(url, "0003")
    engine = make_engine(url)
    t = "'2026-01-01 00:00:00'"
    sha = "e" * 64
    with engine.begin() as conn:
        for statement in [
            f"INSERT INTO users (id, name, is_admin, created) VALUES (1, 'alice', TRUE, {t}), (2, 'bob', FALSE, {t})",
            f"INSERT INTO folders (id, path, parent_id, owner_id, created) VALUES (1, '/alice', NULL, 1, {t}), "
            f"(2, '/bob', NULL, 2, {t}), (3, '/alice/shared', 1, 1, {t}), (4, '/alice/shared/sub', 3, 2, {t}), "
            f"(5, '/bobby', NULL, 1, {t}), (6, '/bobby/x', 5, 2, {t})",
            "INSERT INTO runs (pk, id, folder_id, owner_id, name, status, labels, description, hparams, meta, "
            f"platform, uploaded) VALUES (1, '{'1' * 32}', 4, 2, 'r', 'Complete', '[]', '', '{{}}', '{{}}', "
            f"'{{}}', {t})",
            f"INSERT INTO blobs (sha256, size, created) VALUES ('{sha}', 3, {t})",
            'INSERT INTO artifacts (pk, id, folder_id, owner_id, name, labels, description, "references", uploaded) '
            f"VALUES (1, '{'2' * 32}', 4, 2, 'a', '[]', '', '[]', {t})",
            f"INSERT INTO artifact_files (artifact_pk, path, size, sha256) VALUES (1, 'f', 3, '{sha}')",
        ]:
            conn.execute(text(statement))
    migrate(engine)
    engine.dispose()
    plain = create_engine(url)
    with plain.connect() as conn:
        owners = dict(conn.execute(text("SELECT path, owner_id FROM folders")).all())
        assert owners == {
            "/alice": 1,
            "/bob": 2,
            "/alice/shared": 1,
            "/alice/shared/sub": 1,
            "/bobby": 1,
            "/bobby/x": 1,
        }
        assert conn.execute(text("SELECT owner_id FROM runs")).scalar_one() == 1
        assert conn.execute(text("SELECT owner_id FROM artifacts")).scalar_one() == 1
        assert conn.execute(text("SELECT sha256, user_id FROM blob_uploads")).all() == [(sha, 2)]
    plain.dispose()


def test_lineage_shows_only_edges_whose_other_end_the_viewer_may_view(server: Server) -> None:
    """Issue 30, item 6 (issue 17, item 7 before it): an edge written by a run you cannot see, or to a
    node never uploaded, is not shown on yours, only counted; so nobody writes into another user's view,
    and the graph is no oracle of private nodes."""
    data = b"weights"
    sha = hashlib.sha256(data).hexdigest()
    assert server.req("PUT", f"/blobs/{sha}", content=data).status_code == 200
    private = "a" * 32
    art = {"id": private, "name": "secret-model", "files": [{"path": "w", "size": len(data), "sha256": sha}]}
    body = {"folder": "p", "make_folder": True, "artifact": art}
    assert server.req("PUT", f"/artifacts/{private}", json=body).status_code == 200
    _upload_run(server, "alice", "shown", RUN)  # alice's run, shared with bob, with an edge to her private artifact
    share = {"kind": "run", "target": RUN, "grantee": "bob", "level": "view"}
    assert server.req("PUT", "/shares", json=share).status_code == 200
    bobs, carols, missing = "b" * 32, "c" * 32, "0" * 32
    _upload_run(server, "bob", "mine", bobs)
    _upload_run(server, "carol", "mine", carols)

    def edge(source: tuple[str, str], target: tuple[str, str], name: str = "n") -> dict:
        return {
            "time": 1.0,
            "source": {"kind": source[0], "id": source[1], "name": name},
            "target": {"kind": target[0], "id": target[1], "name": name},
        }

    def post(user: str, run_id: str, *edges: dict) -> None:
        cursor = server.req("GET", f"/runs/{run_id}", user=user).json()["cursors"].get("lineage.jsonl", 0)
        lines = {"start": cursor, "end": cursor + 1, "edges": list(edges)}
        assert server.req("POST", f"/runs/{run_id}/lineage", user=user, json=lines).status_code == 200

    post("alice", RUN, edge(("run", RUN), ("artifact", private), "secret-model"))
    post("bob", bobs, edge(("run", bobs), ("artifact", private), "guess"), edge(("run", bobs), ("artifact", missing)))
    post("bob", bobs, edge(("run", RUN), ("run", bobs)))  # alice's run (which bob sees) fed his
    # carol, who sees nothing of bob's, writes an edge from her run to his
    post("carol", carols, edge(("run", carols), ("run", bobs), "carol-wrote-this"))

    def lineage(user: str, run_id: str) -> tuple[list[tuple[str, str, str]], int]:
        got = server.req("GET", f"/runs/{run_id}", user=user).json()
        ends = [(e["source"]["id"], e["target"]["id"], e["source"]["name"]) for e in got["lineage"]]
        return ends, got["lineage_hidden"]

    assert lineage("bob", bobs) == ([(RUN, bobs, "r")], 3)  # the private artifact, the missing one, carol's run
    assert lineage("bob", RUN) == ([(RUN, bobs, "r")], 1)  # alice's edge to her private artifact
    assert lineage("alice", RUN) == ([(RUN, private, "r")], 1)  # bob's run is not shared with alice
    assert lineage("carol", carols) == ([], 1)
    # the console draws what the API gives, and says how many edges it leaves out
    server.console_login("bob")
    page = server.client.get(f"/ui/runs/{bobs}").text
    assert f"/ui/runs/{RUN}" in page and carols not in page and private not in page and missing not in page
    assert "carol-wrote-this" not in page and "secret-model" not in page
    assert "3 edges to runs or artifacts not shared with you, or not uploaded, are not shown." in page
    page = server.client.get(f"/ui/runs/{RUN}").text
    assert "secret-model" not in page and private not in page and "1 edge to runs or artifacts" in page


@pytest.mark.parametrize("link", ["stdout.log", "metrics/train.jsonl", "artifact files/"])
def test_the_client_refuses_a_symlink_anywhere_in_what_it_uploads(server: Server, tmp_path: Path, link: str) -> None:
    """Issue 17, item 10: a link in a run or artifact folder would send a file from elsewhere."""
    secret = tmp_path / "elsewhere"
    secret.mkdir()
    (secret / "id_rsa").write_text('{"step": 0, "time": 1.0, "metrics": {"x": 1.0}}\n')
    run, _ = train_tiny(tmp_path / "store", steps=2)
    run.finish()
    art_dir = next((tmp_path / "store" / "artifacts").iterdir())
    if link == "artifact files/":
        shutil.copy(art_dir / "files" / "model.pt", secret / "model.pt")
        shutil.rmtree(art_dir / "files")
        replaced = art_dir / "files"
        os.symlink(secret, replaced)
    else:
        replaced = run.path / link
        replaced.unlink()
        os.symlink(secret / "id_rsa", replaced)
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
    with pytest.raises(UploadError, match=f"{re.escape(str(replaced))} is a symbolic link"):
        upload_run(run.path, client=client)
    if link == "artifact files/":
        with pytest.raises(UploadError, match="symbolic link"):
            upload_artifact(art_dir, client=client)
    assert not any(p.is_file() for p in (server.settings.data_dir / "blobs").rglob("*"))
    with server.client.app.state.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM log_pieces")).scalar() == 0
        assert conn.execute(text("SELECT count(*) FROM metric_points")).scalar() == 0


def test_small_ones_folders_unknown_grantees_and_no_store(server: Server) -> None:
    """Issue 17, item 11."""
    # parents=false makes a direct child of an existing folder (and only that)
    assert server.req("POST", "/folders", json={"path": "top", "parents": False}).json() == {"path": "/alice/top"}
    assert server.req("POST", "/folders", json={"path": "top/child"}).json() == {"path": "/alice/top/child"}
    deep = server.req("POST", "/folders", json={"path": "top/a/b", "parents": False})
    assert deep.status_code == 404 and "parents=true" in deep.json()["detail"]
    # sharing with a name that is no user answers exactly as with a user: nobody learns who exists
    answers = []
    for grantee in ("bob", "nobody"):
        r = server.req(
            "PUT", "/shares", json={"kind": "folder", "target": "/alice/top", "grantee": grantee, "level": "view"}
        )
        answers.append((r.status_code, r.json()["shares"][-1 if grantee == "nobody" else 0]["level"]))
    assert answers == [(200, "view"), (200, "view")]
    # ... and the grant does not pass to a user created later under that name
    key = server.req("POST", "/users", json={"name": "nobody"}).json()["key"]
    server.keys["nobody"] = key
    assert server.req("GET", "/folders", user="nobody", params={"path": "/alice/top"}).status_code == 404
    # no API answer may stay in a cache: a new key above all
    for method, path, kwargs in [
        ("POST", "/keys", {"json": {"label": "laptop"}}),
        ("GET", "/me", {}),
        ("GET", "/runs/" + "0" * 32, {}),
        ("GET", "/openapi.json", {}),
    ]:
        r = server.req(method, path, **kwargs)
        assert r.headers.get("cache-control") == "no-store", (path, r.status_code, r.headers)
    assert server.client.get("/ui/static/console.css").headers.get("cache-control") != "no-store"


def test_ids_folder_and_user_names_with_a_trailing_newline_are_refused(server: Server) -> None:
    """``$`` also matches before a final newline: every name and id check matches the whole value.

    Before, a run id ``<32 hex>\\n``, a folder ``sub\\n`` and a user ``eve\\n`` were stored.
    """
    run_id = "3" * 32 + "\n"
    attempts = [
        ("PUT", f"/runs/{quote(run_id)}", {"json": {"run": {"id": run_id, "name": "r", "status": "Complete"}}}),
        ("POST", "/folders", {"json": {"path": "sub\n"}}),
        ("POST", "/users", {"json": {"name": "eve\n"}}),
        ("GET", f"/runs/{'3' * 32}%0A", {}),
    ]
    for method, path, kwargs in attempts:
        answer = server.req(method, path, **kwargs)
        assert answer.status_code == 422, (method, path, answer.status_code, answer.text[:200])
    with server.client.app.state.engine.connect() as conn:
        stored = [
            *conn.execute(text("SELECT id FROM runs")).scalars(),
            *conn.execute(text("SELECT path FROM folders")).scalars(),
        ]
    assert not [s for s in stored if "\n" in s]
