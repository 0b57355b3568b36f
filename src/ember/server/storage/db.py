"""Database engines and sessions, and running the Alembic migrations.

SQLite (the default) runs in WAL mode with a busy timeout, and every transaction of the
writing engine starts with ``BEGIN IMMEDIATE``: writers queue for the lock instead of failing
with "database is locked" when a read transaction tries to become a write one. Requests that
only read (``GET``) use a second engine whose transactions start with a plain ``BEGIN`` on
``query_only`` connections: in WAL mode they read a snapshot and never wait for a writer. A
``GET`` that tried to write would fail loudly. PostgreSQL needs none of that: both are one engine.

Writers of one process take turns in a first-come, first-served queue before ``BEGIN
IMMEDIATE`` (:class:`WriterQueue`). Without it they wait inside SQLite's busy handler, which
polls with sleeps of up to 100 ms: under load a writer could lose the lock again and again and
wait seconds (the tail latency of the load benchmark). The busy timeout stays for writers of
other processes (``ember server user add`` while the server runs).

:func:`json_item` reads a key of a JSON column in SQL on either database.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, ColumnElement, Engine, Text, case, cast, create_engine, event, func, null, type_coerce
from sqlalchemy.orm import Session, sessionmaker

from ember.server.storage.settings import ServerError

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
        queue = WriterQueue()
        connection_class = type("QueuedConnection", (_QueuedConnection,), {"queue": queue})
        connect_args = {
            "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
            "check_same_thread": False,
            "factory": connection_class,
        }
        engine = create_engine(url, connect_args=connect_args)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    try:
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    except ModuleNotFoundError as e:  # SQLAlchemy imports the URL's driver here
        raise ServerError(_missing_driver(url, e.name or "")) from None


def _missing_driver(url: str, module: str) -> str:
    scheme = url.split("://", 1)[0]
    if scheme == "postgresql+psycopg":
        return f"the database URL {scheme}://... needs the PostgreSQL driver psycopg: pip install 'ember[postgres]'"
    return (
        f"the database URL {scheme}://... needs the Python module {module!r}, which is not installed: "
        "use postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB with pip install 'ember[postgres]'"
    )


def make_reader(engine: Engine) -> Engine:
    """The engine for read-only requests: on SQLite one whose snapshots never wait for writers; else ``engine``."""
    if engine.dialect.name != "sqlite":
        return engine
    reader = create_engine(
        engine.url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
    )
    event.listen(reader, "connect", _sqlite_connect)
    event.listen(reader, "connect", _sqlite_query_only)
    event.listen(reader, "begin", _sqlite_begin_read)
    return reader


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own transaction handling is turned off; "begin" below starts each one.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class WriterQueue:
    """First come, first served turns for the writing transactions of one process.

    A turn is taken before ``BEGIN IMMEDIATE`` and given back when the connection commits, rolls
    back or closes (whichever thread does it). A writer that waits longer than the busy timeout
    fails as SQLite would, with "database is locked", and leaves the queue.
    """

    def __init__(self, timeout_s: float = SQLITE_BUSY_TIMEOUT_MS / 1000) -> None:
        self.timeout_s = timeout_s
        self._changed = threading.Condition()
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()
        self._holder: object | None = None

    def take(self, holder: object) -> None:
        """Wait for this holder's turn.

        Raises:
            sqlite3.OperationalError: the turn did not come within the busy timeout.
        """
        with self._changed:
            ticket = self._next_ticket
            self._next_ticket += 1
            deadline = time.monotonic() + self.timeout_s
            while self._serving != ticket:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._abandoned.add(ticket)
                    raise sqlite3.OperationalError(
                        f"database is locked: the writers before this one held it for over {self.timeout_s:.0f} s"
                    )
                self._changed.wait(left)
            self._holder = holder

    def give_back(self, holder: object) -> None:
        """End ``holder``'s turn (nothing when it holds none)."""
        with self._changed:
            if self._holder is holder:
                self._holder = None
                self._serving += 1
                while self._serving in self._abandoned:
                    self._abandoned.discard(self._serving)
                    self._serving += 1
                self._changed.notify_all()


class _QueuedConnection(sqlite3.Connection):
    """A writer's DBAPI connection: its turn in the engine's :class:`WriterQueue` ends with its transaction."""

    queue: WriterQueue

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.queue.give_back(self)

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.queue.give_back(self)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.queue.give_back(self)


def _sqlite_begin(connection: Any) -> None:
    dbapi_connection = connection.connection.dbapi_connection
    dbapi_connection.queue.take(dbapi_connection)
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    except BaseException:
        dbapi_connection.queue.give_back(dbapi_connection)
        raise


def _sqlite_query_only(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA query_only=ON")
    cursor.close()


def _sqlite_begin_read(connection: Any) -> None:
    connection.exec_driver_sql("BEGIN")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine`` that keep loaded objects usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on an exception."""
    with factory() as session, session.begin():
        yield session


def _alembic_config(connection: Any = None) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest schema revision this ember knows (its last migration, e.g. ``"0005"``)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "no migrations shipped"
    return head


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at; None for a database ember never wrote to."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (creating it on an empty database).

    Only on purpose: ``ember server db upgrade``, ``ember server init`` on an empty database, and
    ``ember ui`` on its own database. A server refuses an older schema (:func:`prepare`).
    """
    from alembic import command

    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "head")


def upgrade_url(url: str) -> tuple[str | None, str]:
    """Bring the database at ``url`` to the newest schema; return its revisions before and after.

    Example:
        >>> upgrade_url("sqlite:////srv/ember/ember.db")
        ('0004', '0005')
    """
    engine = make_engine(url)
    try:
        check_database(engine)
        before = current_revision(engine)
        migrate(engine)
        return before, head_revision()
    finally:
        engine.dispose()


def upgrade_command(engine: Engine) -> str:
    """The command that upgrades this database, to print in errors."""
    where = engine.url.render_as_string(hide_password=True)
    return f"ember server db upgrade --db '{where}'"


def prepare(engine: Engine) -> None:
    """Create the newest schema on an empty database; accept the newest; refuse any other.

    An empty database (no tables) gets the newest schema, as MLflow's server does; a database at
    an older revision is left as it is: upgrading is a decision (back it up first), made with
    ``ember server db upgrade``.

    Raises:
        ServerError: the schema is older than this ember's, newer (written by a later ember), or
            the database holds tables that are not ember's.
    """
    from sqlalchemy import inspect

    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    where = engine.url.render_as_string(hide_password=True)
    if current is None:
        tables = inspect(engine).get_table_names()
        if not tables:
            migrate(engine)
            return
        raise ServerError(
            f"the database {where} holds tables ({', '.join(sorted(tables)[:5])}) but no ember schema: "
            "give the server a database of its own"
        )
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        ScriptDirectory.from_config(_alembic_config()).get_revision(current)
    except CommandError:
        raise ServerError(
            f"the database {where} is at schema revision {current}, which this ember (schema {head}) does not "
            "know: a newer ember upgraded it; install that version"
        ) from None
    raise ServerError(
        f"the database {where} is at schema revision {current}, this ember needs {head}: back it up, then run "
        f"`{upgrade_command(engine)}`"
    )


def check_database(engine: Engine) -> None:
    """Raise :class:`ServerError` naming the URL's host when the database cannot be reached."""
    from sqlalchemy.exc import OperationalError

    try:
        with engine.connect():
            pass
    except OperationalError as e:
        where = engine.url.render_as_string(hide_password=True)
        raise ServerError(f"cannot connect to the database {where}: {e.orig}") from None


def json_item(session: Session, column: Any, key: str | tuple[str, ...]) -> ColumnElement[Any]:
    """``column[key]`` read in SQL, NULL for a row the database cannot parse as JSON.

    Rows stored before the API refused them may hold NaN (which SQLite's JSON functions reject
    as malformed) or ``\\u0000`` (which PostgreSQL's ``->`` cannot convert): one such run must
    not make every listing that reads the column fail.
    """
    if session.get_bind().dialect.name == "sqlite":
        readable = func.json_valid(column) == 1
    else:
        readable = func.strpos(cast(column, Text), "\\u0000") == 0
    return type_coerce(case((readable, column[key]), else_=null()), JSON)
