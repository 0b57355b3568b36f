"""Fixtures: a server app on SQLite (and on PostgreSQL when ``$EMBER_TEST_POSTGRES_URL`` is set).

Under CI (``$CI`` set) the PostgreSQL URL is required: a missing one fails the PostgreSQL
variant of every database test instead of skipping it, so a broken install cannot go unnoticed.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

from ember.server.app import create_app  # noqa: E402
from ember.server.services import admin  # noqa: E402
from ember.server.storage.settings import Settings  # noqa: E402

PG_ENV = "EMBER_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a new PostgreSQL database dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'server.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        if os.environ.get("CI"):
            pytest.fail(f"${PG_ENV} is not set under CI: scripts/postgres.sh must start PostgreSQL first")
        pytest.skip(f"${PG_ENV} not set (run scripts/postgres.sh start and export it)")
    import psycopg

    name = f"ember_test_{secrets.token_hex(6)}"
    admin_url = base.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    head, _, _ = base.rpartition("/")
    yield f"{head}/{name}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@dataclass
class Server:
    """An app with its admin ('alice'), helpers for users and authorised requests."""

    settings: Settings
    client: TestClient
    keys: dict[str, str] = field(default_factory=dict)

    def add_user(self, name: str) -> str:
        self.keys[name] = admin.add_user(self.settings, name)
        return self.keys[name]

    def h(self, user: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[user]}"}

    def req(self, method: str, path: str, user: str | None = "alice", **kwargs: Any) -> Any:
        headers = self.h(user) if user else {}
        return self.client.request(method, f"/api/v1{path}", headers=headers, **kwargs)

    def console_login(self, user: str = "alice") -> None:
        """Log the test client's browser in to the console as ``user`` (the login form, with its CSRF token)."""
        self.client.cookies.clear()
        page = self.client.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf, page.text[:300]
        form = {"api_key": self.keys[user], "csrf": csrf.group(1)}
        assert self.client.post("/ui/login", data=form, follow_redirects=False).status_code == 303


def alembic_to(url: str, revision: str, down: bool = False) -> None:
    """Bring the database at ``url`` to schema ``revision`` (up, or down with ``down``): a test's old server."""
    from alembic import command
    from alembic.config import Config

    from ember.server.storage.db import MIGRATIONS, make_engine

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = make_engine(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)
    engine.dispose()


def make_server(tmp_path: Path, db_url: str, **limits: int) -> Server:
    settings = Settings.make(data_dir=tmp_path / "data", db_url=db_url, **limits)
    key = admin.init(settings, "alice")
    client = TestClient(create_app(settings))
    return Server(settings, client, {"alice": key})


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[Server]:
    """A server on a fresh database with the admin 'alice' and the users 'bob' and 'carol'."""
    srv = make_server(tmp_path, db_url)
    srv.add_user("bob")
    srv.add_user("carol")
    with srv.client:
        yield srv
    srv.client.app.state.engine.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``ember server`` in a real process on a loopback port; ``kill()`` and ``start()`` again."""

    def __init__(self, data: Path, db_url: str, port: int | None = None, workers: int = 1) -> None:
        self.data, self.db_url, self.workers = data, db_url, workers
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data.parent / f"server-{self.port}.log"

    def start(self) -> ServerProcess:
        argv = [sys.executable, "-m", "ember.server.cli", "server", "--db", self.db_url, "--data", str(self.data)]
        argv += ["--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                httpx.get(f"{self.url}/api/v1/openapi.json", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """Shut down gracefully: with ``workers > 1`` a killed supervisor would orphan its workers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture
def server_process(tmp_path: Path, db_url: str) -> Iterator[tuple[ServerProcess, str]]:
    """A real server process on a fresh database, and the admin's key."""
    settings = Settings.make(data_dir=tmp_path / "data", db_url=db_url)
    key = admin.init(settings, "alice")
    proc = ServerProcess(settings.data_dir, db_url).start()
    try:
        yield proc, key
    finally:
        proc.kill()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$HOME (for ~/.ember/credentials) and $EMBER_HOME (the local store) under tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "store"))
    monkeypatch.delenv("EMBER_HOST", raising=False)
    monkeypatch.delenv("EMBER_API_KEY", raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"
