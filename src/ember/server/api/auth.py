"""Who is asking: the request's API key checked (401 without a valid one), and the request's session.

The FastAPI dependencies every API route takes (:data:`CurrentUser`, :data:`BriefUser`,
:data:`DbSession`); the keys themselves (made, stored, verified) are :mod:`ember.server.services.keys`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session, sessionmaker

from ember.server.services.keys import verify_key
from ember.server.services.upload import Uploads
from ember.server.storage.models import ApiKey, User

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
    """The user whose key the request carries; 401 without a valid one. The key's row is kept in
    ``request.state.api_key`` (:data:`CallerKey`)."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise HTTPException(401, _UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    row = verify_key(session, key.strip())
    user = session.get(User, row.user_id) if row is not None else None
    if row is None or user is None:
        raise HTTPException(401, "the API key is unknown, revoked or expired", headers={"WWW-Authenticate": "Bearer"})
    request.state.api_key = row
    return user


def caller_key(request: Request, _user: Annotated[User, Depends(current_user)]) -> ApiKey:
    """The stored row of the key the request came with (after :func:`current_user` checked it)."""
    return request.state.api_key


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
CallerKey = Annotated[ApiKey, Depends(caller_key)]
"""An endpoint parameter: the caller's key (what a key made by this request may not outlive)."""
DbSession = Annotated[Session, _SESSION]
"""An endpoint parameter: the request's session (commits on success)."""


def uploads(request: Request, user: CurrentUser, session: DbSession) -> Uploads:
    """The server's receiver of the upload protocol for this request (its caller, its session, the limits)."""
    return Uploads(session, user, request.app.state.settings, request.app.state.blobs)


Receiving = Annotated[Uploads, Depends(uploads)]
"""An endpoint parameter: :class:`~ember.server.services.upload.Uploads` for the caller, in the request's session."""
