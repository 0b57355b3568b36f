"""`ember ui` against DNS rebinding and other local users (issue 17, item 5), without a browser.

Before: `ember ui` answered any ``Host`` header, with no login: a web page whose host name an
attacker re-points at 127.0.0.1 could read every run. Now it answers only loopback names, and
only a browser that opened the link it printed (a per-launch token, which sets a cookie).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from ember import track
from ember.server.app import create_app
from ember.server.cli import _settings, add_commands
from ember.server.local.ui import build_app
from ember.server.storage.settings import Settings


def test_ember_ui_answers_only_loopback_names_and_the_launch_token(tmp_path: Path) -> None:
    run = track.create_run(name="private", home=tmp_path / "store")
    run.finish()
    app, entry = build_app(tmp_path / "store", 8766, tmp_path / "ui")
    token_url = urlsplit(entry)
    assert token_url.netloc == "127.0.0.1:8766" and token_url.path == "/ui/" and token_url.query.startswith("token=")
    app.state.console_index.step()  # what `ember ui` indexes in the background
    with TestClient(app, base_url="http://127.0.0.1:8766") as client:
        for host in ("evil.example", "evil.example:8766", "127.0.0.1.evil.example", "192.168.1.20:8766"):
            r = client.get("/ui/runs", headers={"host": host})
            assert r.status_code == 400 and "host name" in r.json()["detail"], (host, r.status_code)
            assert client.get("/api/v1/openapi.json", headers={"host": host}).status_code == 400
        assert client.get("/ui/runs").status_code == 403  # loopback, but without the token
        assert "link" in client.get("/ui/runs").text
        assert client.get("/ui/runs?token=wrong").status_code == 403
        r = client.get(f"/ui/runs?token={token_url.query[6:]}&q=x", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/runs?q=x"
        assert "httponly" in r.headers["set-cookie"].lower() and "samesite=strict" in r.headers["set-cookie"].lower()
        for host in ("127.0.0.1:8766", "localhost:8766", "[::1]:8766", "LOCALHOST"):
            page = client.get("/ui/runs", headers={"host": host})
            assert page.status_code == 200 and "private" in page.text, host
    client.cookies.clear()
    assert TestClient(app, base_url="http://127.0.0.1:8766").get("/ui/runs").status_code == 403


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_ember_server_answers_loopback_names_unless_told_others(tmp_path: Path) -> None:
    data = ["--data", str(tmp_path / "data"), "--db", f"sqlite:///{tmp_path / 'db'}"]
    default = _settings(_parsed(["server", *data]))
    assert default.allowed_hosts == ("127.0.0.1", "localhost", "::1")
    proxied = _settings(_parsed(["server", *data, "--allowed-hosts", "ember.example.org,10.0.0.5"]))
    assert proxied.allowed_hosts == ("ember.example.org", "10.0.0.5")
    assert _settings(_parsed(["server", *data, "--allowed-hosts", "*"])).allowed_hosts is None
    listening = _settings(_parsed(["server", *data, "--host", "10.0.0.5"]))
    assert listening.allowed_hosts == ("127.0.0.1", "localhost", "::1", "10.0.0.5")
    client = TestClient(create_app(proxied), base_url="http://ember.example.org")
    assert client.get("/api/v1/openapi.json").status_code == 200
    assert client.get("/api/v1/openapi.json", headers={"host": "127.0.0.1:8765"}).status_code == 400
    with pytest.raises(ValueError, match="without port"):
        Settings.make(data_dir=tmp_path, allowed_hosts=["ember.example.org:443"])
