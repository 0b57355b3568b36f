"""What ``ember ui`` last read of each run folder, kept in its own database so that a restart reads only what changed.

``ember ui --data DIR`` keeps its database across starts. Without this, a restart checked every run
folder again as a changed one (its ``run.json`` read, checked and sent request by request): at 5,000
runs longer than the first start. Now each run folder indexed whole leaves a row in the table
``ember_ui_folders`` of that database, in the transaction that stored what was read: the folder's
name, a digest of its :func:`~ember.server.local.scan.signature` (the names, kinds, sizes, inodes
and modification times of its files, taken *before* it was read), the id it is listed under, why it
is Damaged (or NULL), and whether it was Running. On a restart a folder whose signature gives the
same digest (and the same :data:`FORMAT`), whose run is still in the database and which was not
Running is listed as it was, without opening a file; any other folder (a file appended, replaced,
touched or edited by hand, a live run, a run gone from the database) is read as before, from the
stored cursors. A row is written only with the data it describes, so it never claims more than the
database holds; a folder gone from the store loses its row with its run.

The table belongs to ``ember ui``'s database alone (created here when missing), not to the
server's schema: a server never reads it, and its migrations do not know it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Boolean, Column, MetaData, String, Table, Text, delete, insert, select
from sqlalchemy.orm import Session

_META = MetaData()
FOLDERS = Table(
    "ember_ui_folders",
    _META,
    Column("name", String(255), primary_key=True),  # the folder's name under runs/
    Column("signature", String(32), nullable=False),
    Column("node_id", String(64), nullable=False),
    Column("error", Text, nullable=True),
    Column("live", Boolean, nullable=False),
)
FORMAT = 1
"""Part of every digest: raised when what the index makes of a folder changes (its checks, what it
stores), so that a restart after an upgrade reads every folder again."""
_CHUNK = 500
"""Names per ``IN (...)`` of a statement."""


@dataclass(frozen=True)
class Kept:
    """One folder as it was last indexed whole: see the module."""

    signature: str
    node_id: str
    error: str | None
    live: bool


def digest(signature: tuple[Any, ...]) -> str:
    """A folder's :func:`~ember.server.local.scan.signature` as 32 hex digits, stable across processes (and
    :data:`FORMAT`)."""
    text = repr((FORMAT, signature))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def load(session: Session) -> dict[str, Kept]:
    """Every folder's row by name (the table is created when missing)."""
    _META.create_all(session.connection(), checkfirst=True)
    rows = session.execute(
        select(FOLDERS.c.name, FOLDERS.c.signature, FOLDERS.c.node_id, FOLDERS.c.error, FOLDERS.c.live)
    )
    return {name: Kept(sig, node, error, bool(live)) for name, sig, node, error, live in rows}


def save(session: Session, rows: dict[str, Kept]) -> None:
    """Replace the rows of these folders (in the caller's transaction)."""
    forget(session, list(rows))
    if rows:
        session.execute(
            insert(FOLDERS),
            [
                {"name": name, "signature": k.signature, "node_id": k.node_id, "error": k.error, "live": k.live}
                for name, k in rows.items()
            ],
        )


def forget(session: Session, names: list[str]) -> None:
    """Drop the rows of these folders (in the caller's transaction)."""
    for at in range(0, len(names), _CHUNK):
        session.execute(delete(FOLDERS).where(FOLDERS.c.name.in_(names[at : at + _CHUNK])))


def names(session: Session) -> list[str]:
    """The folders that have a row."""
    return list(session.scalars(select(FOLDERS.c.name)))


__all__ = ["FOLDERS", "Kept", "digest", "forget", "load", "names", "save"]
