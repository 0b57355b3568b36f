"""API keys: made random, shown once, stored as a sha256 digest, compared in constant time.

A key reads ``ember_<key id>_<secret>``: the key id (16 hex digits, not secret) finds the row,
then the digest of the whole key is compared with :func:`hmac.compare_digest`. Keys carry 256
bits of randomness, so a fast hash is enough (there is nothing to brute-force). Keys are never
logged; error messages name the key id at most.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ember.server.models import ApiKey, User

KEY_PREFIX = "ember_"
_KEY = re.compile(r"^ember_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
# Compared against when no key row matches, so both paths cost one compare_digest.
_DUMMY_DIGEST = hashlib.sha256(b"no such key").hexdigest()


def now() -> datetime:
    """The current time in UTC."""
    return datetime.now(timezone.utc)


def digest(key: str) -> str:
    """The stored form of a key."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key(session: Session, user: User, label: str = "", expires: datetime | None = None) -> str:
    """Create an API key for ``user`` and return it: the only time the full key exists.

    Example:
        >>> key = new_key(session, alice, label="laptop")   # print it once, store nothing else
    """
    key_id = secrets.token_hex(8)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    session.add(
        ApiKey(key_id=key_id, digest=digest(key), user_id=user.id, label=label[:100], created=now(), expires=expires)
    )
    return key


def key_id_of(key: str) -> str | None:
    """The public id part of a key, or None when it is not shaped like one."""
    match = _KEY.match(key)
    return match.group(1) if match else None


def verify(session: Session, key: str) -> User | None:
    """The user a key belongs to, or None when it is unknown, revoked, expired or malformed."""
    match = _KEY.match(key)
    row = session.scalar(select(ApiKey).where(ApiKey.key_id == match.group(1))) if match else None
    stored = row.digest if row is not None else _DUMMY_DIGEST
    if not hmac.compare_digest(stored, digest(key)) or row is None:
        return None
    if row.revoked is not None:
        return None
    if row.expires is not None and aware(row.expires) <= now():
        return None
    return session.get(User, row.user_id)


def aware(when: datetime) -> datetime:
    """A datetime read from the database, in UTC: SQLite gives back naive ones, written in UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


READS = ("GET", "HEAD")
"""Methods whose requests only read: their sessions come from ``app.state.read_sessions``."""


def sessions_for(request: Request) -> sessionmaker[Session]:
    """The session factory for a request: read-only snapshots for GET/HEAD, the writer otherwise."""
    state = request.app.state
    return state.read_sessions if request.method in READS else state.sessions


def get_session(request: Request) -> Iterator[Session]:
    """A request's session; its transaction commits when the endpoint returns without error."""
    with sessions_for(request)() as session, session.begin():
        yield session


_UNAUTHORIZED = (
    "a valid API key is required: send 'Authorization: Bearer <key>' (create one with `ember server key create`)"
)


# scope="function": the transaction commits before the response leaves. FastAPI's default
# ("request") commits after it is sent, so a client could be told a batch is stored, and move
# its cursor past it, while a crash loses the commit.
_SESSION = Depends(get_session, scope="function")


def current_user(request: Request, session: Annotated[Session, _SESSION]) -> User:
    """The user whose key the request carries; 401 without a valid one."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise HTTPException(401, _UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    user = verify(session, key.strip())
    if user is None:
        raise HTTPException(401, "the API key is unknown, revoked or expired", headers={"WWW-Authenticate": "Bearer"})
    return user


def current_user_brief(request: Request) -> User:
    """Like :func:`current_user`, in a read-only transaction of its own that ends before the endpoint runs.

    For streaming uploads: on SQLite a request's writing transaction holds the write lock, which
    must not stay held while a large file arrives.
    """
    with request.app.state.read_sessions() as session, session.begin():
        return current_user(request, session)


CurrentUser = Annotated[User, Depends(current_user)]
"""An endpoint parameter: the authenticated caller (401 without a valid key)."""
BriefUser = Annotated[User, Depends(current_user_brief)]
"""The caller, checked in a transaction that ends before the endpoint runs."""
DbSession = Annotated[Session, _SESSION]
"""An endpoint parameter: the request's session (commits on success)."""
