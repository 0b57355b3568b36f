"""A folder's contents a page at a time: ``GET /api/v1/folders`` and the console's folder page.

A folder may hold tens of thousands of runs; answering them all took seconds and megabytes. A
page holds at most ``limit`` sub-folders, ``limit`` runs and ``limit`` artifacts, each list in a
fixed order read through an index range from where the previous page ended (keyset
pagination, not ``OFFSET``): a page costs the same at the first run as at the 10,000th, and a
run added meanwhile neither repeats nor skips one. The orders: sub-folders by path, runs newest
first (start time, then upload order), artifacts by name.

``next_page_token`` carries where each list ended, for the same folder only; it is opaque to
clients (base64 of JSON) and checked when it comes back: a token that is not one this server
gave for this folder is a 422, never a page of something else.

Example:
    >>> page = folder_page(session, folder, limit=100, token=None)
    >>> page.runs[0]["name"], page.next_page_token
    ('mnist-ddp', 'eyJmIjo...')
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, literal_column, or_, select
from sqlalchemy.orm import Session

from ember.server.storage.domain_errors import Invalid
from ember.server.storage.models import Artifact, Folder, Run

MAX_LIMIT = 1000
"""The most entries of each list one page may hold."""
_END = "end"
_BAD = "page_token: not a token this server gave for this folder (pass the previous answer's next_page_token)"


@dataclass
class FolderPage:
    """One page of a folder's sub-folders, runs and artifacts.

    Attributes:
        folders: sub-folder paths; runs: ``{pk, id, name, status, start_time, end_time}`` (status
            as stored); artifacts: ``{id, name}``; next_page_token: continues whichever list is
            not finished, None when every list is.
    """

    folders: list[str]
    runs: list[dict[str, Any]]
    artifacts: list[dict[str, Any]]
    next_page_token: str | None


def _start_key() -> ColumnElement[str]:
    # A run without a start time sorts last (as the oldest), the same on SQLite and PostgreSQL.
    # The '' is written into the SQL, not bound: a database matches an index on an expression
    # only when the query holds the same expression, and coalesce(start_time, ?) is not it.
    return func.coalesce(Run.start_time, literal_column("''"))


def folder_page(session: Session, folder: Folder, limit: int, token: str | None) -> FolderPage:
    """The page of ``folder``'s contents after ``token`` (the first page without one).

    Args:
        session: a session that may read the folder (the caller checked the right to view it).
        folder: the folder listed.
        limit: the most entries of each list (1..:data:`MAX_LIMIT`).
        token: the previous page's ``next_page_token``, or None.

    Raises:
        Invalid: 422 when ``token`` is not one this server gave for this folder.
    """
    where = _parse(token, folder.id)
    folders, folders_at = _take(
        session,
        select(Folder.path).where(Folder.parent_id == folder.id),
        (Folder.path,),
        where["d"],
        limit,
        descending=False,
    )
    runs, runs_at = _take(
        session,
        select(_start_key(), Run.pk, Run.id, Run.name, Run.status, Run.start_time, Run.end_time).where(
            Run.folder_id == folder.id, Run.deleted.is_(None)
        ),
        (_start_key(), Run.pk),
        where["r"],
        limit,
        descending=True,
    )
    artifacts, artifacts_at = _take(
        session,
        select(Artifact.name, Artifact.pk, Artifact.id).where(Artifact.folder_id == folder.id),
        (Artifact.name, Artifact.pk),
        where["a"],
        limit,
        descending=False,
    )
    positions = {"d": folders_at, "r": runs_at, "a": artifacts_at}
    more = any(v != _END for v in positions.values())
    return FolderPage(
        folders=[row.path for row in folders],
        runs=[
            {
                "pk": r.pk,
                "id": r.id,
                "name": r.name,
                "status": r.status,
                "start_time": r.start_time,
                "end_time": r.end_time,
            }
            for r in runs
        ],
        artifacts=[{"id": a.id, "name": a.name} for a in artifacts],
        next_page_token=_encode({"f": folder.id, **positions}) if more else None,
    )


def _take(
    session: Session, query: Any, key: tuple[Any, ...], after: Any, limit: int, descending: bool
) -> tuple[list[Any], Any]:
    """Up to ``limit`` rows of ``query`` past ``after`` in ``key`` order, and where the list now stands.

    ``query`` selects the ``key`` columns first: the last row's are where the next page starts.
    """
    if after == _END:
        return [], _END
    if after is not None:
        query = query.where(_past(key, after, descending))
    order = [k.desc() for k in key] if descending else list(key)
    rows = list(session.execute(query.order_by(*order).limit(limit + 1)))
    if len(rows) <= limit:
        return rows, _END
    rows = rows[:limit]
    return rows, list(rows[-1][: len(key)])


def _past(key: tuple[Any, ...], after: list[Any], descending: bool) -> ColumnElement[bool]:
    """Rows strictly after ``after`` in ``key`` order.

    Written out rather than as a row value, with a range on the first column that SQLite and
    PostgreSQL both read from the index: ``a <= x AND (a < x OR (a = x AND b < y))``.
    """
    first, *rest = key
    beyond = first < after[0] if descending else first > after[0]
    if not rest:
        return beyond
    tie = rest[0] < after[1] if descending else rest[0] > after[1]
    near = first <= after[0] if descending else first >= after[0]
    return and_(near, or_(beyond, and_(first == after[0], tie)))


def _encode(position: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(position, separators=(",", ":")).encode()).decode().rstrip("=")


def _parse(token: str | None, folder_id: int) -> dict[str, Any]:
    """Where each list starts: a token this server gave for this folder, checked (422 otherwise)."""
    if token is None or token == "":
        return {"d": None, "r": None, "a": None}
    try:
        position = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise Invalid(_BAD) from None
    shapes = {"d": (str,), "r": (str, int), "a": (str, int)}
    if not isinstance(position, dict) or set(position) != {"f", *shapes} or type(position["f"]) is not int:
        raise Invalid(_BAD)
    if position["f"] != folder_id:
        raise Invalid(_BAD)
    for name, types in shapes.items():
        value = position[name]
        if value is None or value == _END:
            continue
        fits = isinstance(value, list) and len(value) == len(types)
        if not fits or not all(type(v) is t for v, t in zip(value, types, strict=True)):
            raise Invalid(_BAD)
    return position
