"""Extras that match roles (issue 22, item 2): a training machine that uploads needs httpx only;
the PostgreSQL driver is its own extra, and the server names it when a postgresql URL lacks it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember.server.cli import main as server_main
from ember.server.storage.db import make_engine
from ember.server.storage.settings import ServerError
from tests.server.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("fastapi", "starlette", "sqlalchemy", "alembic", "uvicorn", "psycopg", "jinja2", "python_multipart")

# Makes this interpreter one where only `pip install 'ember[client]'` ran: the server's packages
# cannot be imported. $EMBER_TEST_CLIENT_PYTHON (scripts/test_lowest.sh) is a real such venv.
_BLOCK = f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVER_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _NotInstalled())
"""

_CLIENT = """
import sys
import ember
from ember.cli import main
from tests.server._runs import train_tiny
from pathlib import Path

store = Path(sys.argv[1])
run, _ = train_tiny(store, steps=12)
run.finish()
run.upload(folder="client", make_folder=True)
print("version", ember.__version__, "run", run.id)
assert main(["upload", str(store), "--folder", "client", "--conflict", "skip"]) == 0
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {server_only!r})
assert not leaked, leaked
"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # what is tested is the client's machine
def test_import_ember_and_upload_with_only_the_client_extra(
    server_process: tuple[ServerProcess, str], home: Path, tmp_path: Path
) -> None:
    proc, key = server_process
    python = os.environ.get("EMBER_TEST_CLIENT_PYTHON")
    code = _CLIENT.format(server_only=SERVER_ONLY)
    argv = [python, "-c", code] if python else [sys.executable, "-c", _BLOCK + code]
    env = {**os.environ, "EMBER_HOST": proc.url, "EMBER_API_KEY": key, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*argv, str(tmp_path / "store")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.split(" run ", 1)[1].split()[0]
    assert f"updated  {run_id} -> /alice/client" in done.stdout  # the CLI found it there: nothing new


def test_a_postgresql_url_without_its_driver_names_the_postgres_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now fails as if not installed
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    url = "postgresql+psycopg://ember:secret@127.0.0.1:1/ember"
    with pytest.raises(ServerError, match=r"needs the PostgreSQL driver psycopg: pip install 'ember\[postgres\]'"):
        make_engine(url)
    assert server_main(["server", "--db", url, "--data", str(tmp_path), "db", "current"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'ember[postgres]'" in err and "secret" not in err
    with pytest.raises(ServerError, match=r"use postgresql\+psycopg://.*ember\[postgres\]"):
        make_engine("postgresql://ember@127.0.0.1:1/ember")  # SQLAlchemy's default driver, psycopg2


def test_each_role_has_its_extra_and_dev_has_them_all() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {role: " ".join(extras[role]) for role in ("client", "server", "postgres", "console", "dev")}
    assert [r.split(">")[0] for r in extras["client"]] == ["httpx"]
    assert "psycopg" not in names["server"] and "psycopg" in names["postgres"]
    assert not any("psycopg" in r or "fastapi" in r for r in project["dependencies"])
    assert all(role in names["dev"] for role in ("client", "server", "postgres", "console"))
