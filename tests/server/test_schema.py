"""The schema is migrated on purpose (issue 22, item 3): ``ember server db upgrade|current``, a server
on an older schema refuses with the command to run, ``ember server init`` creates the newest one."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from ember.server.app import create_app
from ember.server.cli import main as server_main
from ember.server.storage.db import MIGRATIONS, head_revision, make_engine
from ember.server.storage.settings import ServerError, Settings

OLD = "0004"


def _at_revision(url: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = make_engine(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def _revision(url: str) -> str | None:
    engine = create_engine(url)
    with engine.connect() as conn:
        value = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()
    engine.dispose()
    return value


def _where(tmp_path: Path, url: str) -> list[str]:
    return ["--db", url, "--data", str(tmp_path / "data")]


def test_a_server_on_an_older_schema_refuses_and_names_the_command_that_upgrades_it(
    tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _at_revision(db_url, OLD)
    where = _where(tmp_path, db_url)
    assert server_main(["server", *where, "--port", "1"]) == 2  # refused before uvicorn starts
    err = capsys.readouterr().err
    assert f"schema revision {OLD}, this ember needs {head_revision()}" in err
    assert "run `ember server db upgrade --db '" in err
    with pytest.raises(ServerError, match="ember server db upgrade"):
        create_app(Settings.make(data_dir=tmp_path / "data", db_url=db_url))
    assert server_main(["server", *where, "user", "add", "bob"]) == 2  # nor do the admin commands migrate
    assert _revision(db_url) == OLD

    assert server_main(["server", "db", "current", *where]) == 0
    assert capsys.readouterr().out.startswith(f"{OLD} (this ember needs {head_revision()}")
    assert server_main(["server", "db", "upgrade", *where]) == 0
    assert f"from schema {OLD} to {head_revision()}" in capsys.readouterr().out
    assert _revision(db_url) == head_revision()
    assert server_main(["server", *where, "db", "current"]) == 0
    assert capsys.readouterr().out.strip() == f"{head_revision()} (the newest schema)"
    app = create_app(Settings.make(data_dir=tmp_path / "data", db_url=db_url))
    app.state.engine.dispose()


def test_init_creates_the_newest_schema_and_upgrade_then_has_nothing_to_do(
    tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    where = _where(tmp_path, db_url)
    assert server_main(["server", "db", "current", *where]) == 0
    assert capsys.readouterr().out.startswith("(none): no ember schema yet; `ember server init` creates")
    assert server_main(["server", "init", "--admin", "root", *where]) == 0
    assert _revision(db_url) == head_revision()
    capsys.readouterr()
    assert server_main(["server", "db", "upgrade", *where]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_schema_from_a_newer_ember_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'server.db'}"
    _at_revision(url, "head")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    assert server_main(["server", *_where(tmp_path, url)]) == 2
    assert "schema revision 9999, which this ember" in capsys.readouterr().err


def test_a_database_holding_other_tables_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE invoices (id INTEGER)"))
    engine.dispose()
    assert server_main(["server", *_where(tmp_path, url), "init", "--admin", "root"]) == 2
    assert "holds tables (invoices) but no ember schema" in capsys.readouterr().err


def test_ember_ui_may_upgrade_its_own_database(tmp_path: Path) -> None:
    from ember.server.services import admin

    url = f"sqlite:///{tmp_path / 'ui.db'}"
    _at_revision(url, OLD)
    settings = Settings.make(data_dir=tmp_path, db_url=url)
    with pytest.raises(ServerError, match="ember server db upgrade"):
        admin.init(settings, "local")
    assert admin.init(settings, "local", upgrade=True).startswith("ember_")
    assert _revision(url) == head_revision()
    create_app(settings, schema="upgrade").state.engine.dispose()
