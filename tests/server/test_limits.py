"""Every stored text and list a request can grow is bounded (issue 30's hunt beyond its six items):
run.json and platform.json, an artifact's labels, files and references, grants per node, live keys
per user, console sessions per key, and the escapes one body may make the server decode; the
client sends a run's output in requests that stay under that bound whatever the text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text

from ember import track
from ember.server.console import session as console_session
from ember.server.services import accounts, codec, perms
from ember.track.client import Client, Credentials, upload_run
from tests.server.conftest import Server

RUN = "a1" * 16


def test_metadata_lists_grants_keys_and_sessions_are_bounded(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    big = {"run": {"id": RUN, "name": "r", "status": "Running", "description": "x" * (1 << 20)}}
    refused = server.req("PUT", f"/runs/{RUN}", json=big)
    assert refused.status_code == 413 and "run.json of run" in refused.json()["detail"]
    assert server.req("PUT", f"/runs/{RUN}", json={**big, "run": {**big["run"], "description": ""}}).status_code == 200
    platform = {"run": {"id": RUN, "name": "r", "status": "Running"}, "platform": {"pip": "y" * (1 << 20)}}
    assert server.req("PUT", f"/runs/{RUN}", json=platform).status_code == 413
    labels = {"artifact": {"id": "b2" * 16, "name": "a", "labels": ["l"] * 1_001}}
    too_many = server.req("PUT", f"/artifacts/{'b2' * 16}", json=labels)
    assert too_many.status_code == 422 and "artifact.labels" in too_many.text
    monkeypatch.setattr(perms, "MAX_GRANTS", 2)
    for name, status in (("bob", 200), ("carol", 200), ("nobody", 413), ("bob", 200)):  # a change is no new grant
        grant = {"kind": "run", "target": RUN, "grantee": name, "level": "edit"}
        assert server.req("PUT", "/shares", json=grant).status_code == status, name
    monkeypatch.setattr(accounts, "MAX_KEYS", 3)  # alice's first key and two more
    answers = [server.req("POST", "/keys", json={"label": str(i)}) for i in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 413]
    assert "revoke those no longer used" in answers[2].json()["detail"]
    server.req("DELETE", f"/keys/{answers[0].json()['key'].split('_')[1]}")
    assert server.req("POST", "/keys", json={"label": "again"}).status_code == 200
    # logging in again and again keeps a bounded number of console sessions
    monkeypatch.setattr(console_session, "MAX_SESSIONS_PER_KEY", 3)
    cookies = []
    for _ in range(5):
        server.console_login("bob")
        cookies.append(server.client.cookies.get(console_session.SESSION_COOKIE))
    with server.client.app.state.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM console_sessions")).scalar_one() == 3
    for cookie, kept in zip(cookies, [False, False, True, True, True], strict=True):
        server.client.cookies.clear()
        server.client.cookies.set(console_session.SESSION_COOKIE, cookie, path="/ui")
        page = server.client.get("/ui/folders", params={"path": "/bob"}, follow_redirects=False)
        assert (page.status_code == 200) == kept, page.status_code


def test_a_body_of_too_many_escapes_is_refused_and_the_client_stays_under_the_bound(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"run": {"id": RUN, "name": "r", "status": "Running"}}
    assert server.req("PUT", f"/runs/{RUN}", json=body).status_code == 200
    flood = {"start": 0, "end": codec.MAX_BACKSLASHES + 1, "text": "\n" * (codec.MAX_BACKSLASHES + 1)}
    refused = server.req("POST", f"/runs/{RUN}/log", json=flood)
    assert refused.status_code == 413 and re.search(r"holds \d+ backslashes", refused.json()["detail"])
    # a run printing 1.2 MiB of blank lines and backslashes uploads whole, in requests under the bound
    run = track.create_run(name="blank", home=tmp_path / "store")
    run.finish()
    output = "\n" * 700_000 + "\\" * 600_000 + "é\n"
    (run.path / "stdout.log").write_text(output)
    client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
    sent = upload_run(run.path, client=client)
    assert sent["cursors"]["stdout.log"] == len(output.encode())
    assert server.req("GET", f"/runs/{run.id}/log").json()["text"] == output
