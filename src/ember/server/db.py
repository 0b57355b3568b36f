"""Database engines and sessions, and running the Alembic migrations.

SQLite (the default) runs in WAL mode with a busy timeout, and every transaction starts with
``BEGIN IMMEDIATE``: writers queue for the lock instead of failing with "database is locked"
when a read transaction tries to become a write one. PostgreSQL needs none of that.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from ember.server.settings import ServerError

SQLITE_BUSY_TIMEOUT_MS = 60_000
MIGRATIONS = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    """A SQLAlchemy engine for ``url`` (SQLite gets WAL, a busy timeout and immediate writes).

    Example:
        >>> engine = make_engine("sqlite:////srv/ember/ember.db")
    """
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own transaction handling is turned off; "begin" below starts each one.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine`` that keep loaded objects usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on an exception."""
    with factory() as session, session.begin():
        yield session


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (creating it on an empty database)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def check_database(engine: Engine) -> None:
    """Raise :class:`ServerError` naming the URL's host when the database cannot be reached."""
    from sqlalchemy.exc import OperationalError

    try:
        with engine.connect():
            pass
    except OperationalError as e:
        where = engine.url.render_as_string(hide_password=True)
        raise ServerError(f"cannot connect to the database {where}: {e.orig}") from None
