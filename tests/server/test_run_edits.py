"""Editing runs on the server (issue 33 item 5): rename, labels, description, the trash.

The server's edit wins over the next upload of the run's run.json for the fields edited; a run
in the trash is hidden from every read, restorable, and purged after ``TRASH_DAYS`` or at once
with ``?purge=true``. Permissions as every change: edit on the run (view-only: 403; nothing: 404).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from ember.server.services import runs
from ember.server.storage.models import Run, now
from tests.server.conftest import Server

RUN = "e" * 32


def _put(server: Server, name: str = "r", labels: list[str] | None = None, description: str = "") -> None:
    meta = {"id": RUN, "name": name, "status": "Complete", "labels": labels or [], "description": description}
    body = {"folder": "shared", "make_folder": True, "run": meta}
    assert server.req("PUT", f"/runs/{RUN}", json=body).status_code == 200


def test_edits_need_edit_rights_and_win_over_the_next_upload(server: Server) -> None:
    _put(server, labels=["local"])
    share = {"kind": "folder", "target": "/alice/shared", "grantee": "bob", "level": "view"}
    assert server.req("PUT", "/shares", json=share).status_code == 200
    edit = {"name": "baseline", "labels": ["keep", " keep", "best "], "description": "the one to beat"}
    for method, path, kwargs in [
        ("PATCH", f"/runs/{RUN}", {"json": edit}),
        ("DELETE", f"/runs/{RUN}", {}),
        ("DELETE", f"/runs/{RUN}?purge=true", {}),
        ("POST", f"/runs/{RUN}/restore", {}),
    ]:
        assert server.req(method, path, user="bob", **kwargs).status_code == 403, (method, path)
        assert server.req(method, path, user="carol", **kwargs).status_code == 404, (method, path)
    got = server.req("PATCH", f"/runs/{RUN}", json=edit).json()
    assert got["labels"] == ["keep", "best"] and got["edited"] == ["description", "labels", "name"]
    # the next upload (a renamed local run, other labels) leaves the edited fields alone, sets the rest
    _put(server, name="renamed-locally", labels=["local"], description="local notes")
    shown = server.req("GET", f"/runs/{RUN}", user="bob").json()
    assert (shown["name"], shown["labels"], shown["description"]) == ("baseline", ["keep", "best"], "the one to beat")
    rows = server.req("GET", "/search/runs", params={"filter": "label = keep and name = baseline"}).json()
    assert [r["id"] for r in rows["runs"]] == [RUN]
    # a field never edited on the server still follows the upload
    server.req("PATCH", f"/runs/{RUN}", json={"labels": []})
    _put(server, name="x", labels=["local"])
    assert server.req("GET", f"/runs/{RUN}").json()["labels"] == []
    for bad in ({"name": ""}, {"name": "a/b"}, {"labels": ["a,b"]}, {"labels": ["x" * 101]}, {"nope": 1}):
        r = server.req("PATCH", f"/runs/{RUN}", json=bad)
        assert r.status_code == 422, (bad, r.status_code, r.text)


def test_the_trash_hides_restores_and_purges(server: Server) -> None:
    _put(server)
    trashed = server.req("DELETE", f"/runs/{RUN}").json()
    assert trashed["id"] == RUN and trashed["purge_after"] > trashed["trashed"]
    assert server.req("GET", f"/runs/{RUN}").status_code == 404
    assert server.req("GET", "/search/runs").json()["total"] == 0
    assert server.req("GET", "/folders", params={"path": "/alice/shared"}).json()["runs"] == []
    assert server.req("PATCH", f"/runs/{RUN}", json={"name": "n"}).status_code == 404
    listed = server.req("GET", "/trash").json()
    assert [r["id"] for r in listed["runs"]] == [RUN] and listed["purge_after_days"] == runs.TRASH_DAYS
    assert server.req("GET", "/trash", user="bob").json()["runs"] == []
    _put(server, name="still-uploading")  # an upload is stored; the run stays in the trash
    assert server.req("GET", f"/runs/{RUN}").status_code == 404
    assert server.req("POST", f"/runs/{RUN}/restore").json() == {"id": RUN, "restored": True}
    assert server.req("GET", f"/runs/{RUN}").json()["name"] == "still-uploading"
    assert server.req("POST", f"/runs/{RUN}/restore").status_code == 404  # not in the trash
    # the hourly collection purges a run whose days in the trash are over, and only that one
    assert server.req("DELETE", f"/runs/{RUN}").status_code == 200
    sessions = server.client.app.state.sessions
    with sessions() as session, session.begin():
        assert runs.purge_expired(session) == 0
        session.execute(update(Run).values(deleted=now() - runs.PURGE_AFTER - timedelta(minutes=1)))
    with sessions() as session, session.begin():
        assert runs.purge_expired(session) == 1
    assert server.req("GET", "/trash").json()["runs"] == []
    assert server.req("POST", f"/runs/{RUN}/restore").status_code == 404
