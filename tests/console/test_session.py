"""Console sessions on the server: logging out ends the session for every copy of its cookie;
revoking the key ends it too (issue 9, login and logout). On SQLite and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

from ember.server.console.session import CSRF_COOKIE, SESSION_COOKIE
from ember.server.services import admin
from tests.server.conftest import Server, make_server


def _csrf(server: Server) -> str:
    page = server.client.get("/ui/login")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert page.status_code == 200 and found, page.text[:300]
    return found.group(1)


def _login(server: Server, key: str) -> str:
    """Log in through the form, as a fresh browser; the session cookie's value."""
    server.client.cookies.clear()
    r = server.client.post("/ui/login", data={"api_key": key, "csrf": _csrf(server)}, follow_redirects=False)
    assert r.status_code == 303, r.text[:300]
    token = server.client.cookies.get(SESSION_COOKIE)
    assert token and key not in token and len(token) >= 40
    server.client.cookies.clear()
    return token


def _is_signed_in(server: Server, token: str) -> bool:
    """Whether a browser sending only this session cookie sees the runs page."""
    r = server.client.get("/ui/runs", headers={"cookie": f"{SESSION_COOKIE}={token}"}, follow_redirects=False)
    assert r.status_code in (200, 303), r.status_code
    return r.status_code == 200


def test_a_cookie_copied_before_logout_is_refused_after_it(tmp_path: Path, db_url: str) -> None:
    server = make_server(tmp_path, db_url)
    with server.client:
        token = _login(server, server.keys["alice"])
        other = _login(server, server.keys["alice"])  # a second browser of the same user
        assert _is_signed_in(server, token) and _is_signed_in(server, other)
        csrf = _csrf(server)
        seed = server.client.cookies.get(CSRF_COOKIE)
        server.client.cookies.clear()
        cookie = f"{SESSION_COOKIE}={token}; {CSRF_COOKIE}={seed}"
        r = server.client.post("/ui/logout", data={"csrf": csrf}, headers={"cookie": cookie}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].endswith("/ui/login")
        assert not _is_signed_in(server, token)  # the copy taken before logout
        assert _is_signed_in(server, other)  # logging out one browser leaves the other signed in
    server.client.app.state.engine.dispose()


def test_revoking_the_key_ends_its_sessions_and_a_forged_cookie_is_refused(tmp_path: Path, db_url: str) -> None:
    server = make_server(tmp_path, db_url)
    with server.client:
        token = _login(server, server.keys["alice"])
        assert _is_signed_in(server, token)
        key_id = server.keys["alice"].split("_")[1]
        admin.revoke_key(server.settings, key_id)
        assert not _is_signed_in(server, token)
        assert not _is_signed_in(server, "x" * 43)
    server.client.app.state.engine.dispose()
